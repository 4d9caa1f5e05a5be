"""What the core install must do without the workbook extra (README, "Install"), as one script
that prints one JSON object: run by tests/integrations/test_without_workbook.py in this venv
(where the workbook is installed but must not be imported) and by tests/e2e/test_core_wheel.py
in a fresh venv holding the core wheel only.

    python tests/helpers/core_paths.py WORKDIR

Each path's result, or its error in one line, so a path that fails fails its own assertion:
a watch of N steps, a whole-run watch, save and load, print, `diagnose`, `diagkit check --json`,
then which workbook modules were imported along the way (none may be).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback

# The workbook extra's modules and what they bring (pyproject.toml, `workbook`).
WORKBOOK = ("matplotlib", "ipywidgets", "papermill", "nbconvert", "nbformat", "IPython",
            "ipykernel", "jupyterlab", "jupyter_server", "jupyter_client", "notebook")

results: dict = {}


def step(name, fn):
    """`fn()`'s value under `name`, or the last line of its traceback."""
    try:
        results[name] = {"value": fn()}
    except BaseException:  # SystemExit included
        results[name] = {"error": traceback.format_exc()}


def main() -> None:
    os.chdir(sys.argv[1])
    import torch

    import diagkit
    results["diagkit"] = diagkit.__file__
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # model[2] held by none: an orphan

    def train(n):
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()

    def steps():
        w = diagkit.watch(model, opt, steps=3)
        train(4)
        w.diagnosis.save("saved")
        return sorted({f.code for f in w.diagnosis.findings})

    def whole():
        w = diagkit.watch(model, opt, steps=None, out="whole")  # the whole run
        train(6)
        w.stop()
        return sorted({f.code for f in diagkit.load("whole").findings})

    def printed():
        return str(diagkit.load("saved"))

    def diagnosed():
        d = diagkit.diagnose(model, opt, batch_fn=lambda: torch.randn(3, 4),
                             loss_fn=lambda m, b: m(b).sum(), steps=2)
        return sorted({f.code for f in d.findings})

    def check():
        from diagkit.run.cli.commands import main as cli
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli(["check", "diagkit.demos:meta_memory", "--steps", "2", "--json",
                        "check.json"])
        with open("check.json", encoding="utf-8") as f:
            return {"code": code, "findings": sorted({x["code"] for x in json.load(f)["findings"]})}

    for name, fn in (("steps", steps), ("whole", whole), ("printed", printed),
                     ("diagnose", diagnosed), ("check", check)):
        step(name, fn)
    results["imported"] = sorted(m for m in WORKBOOK if sys.modules.get(m) is not None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
