"""The core install without the workbook extra (README, "Install"; issue: an install that fits a
training image). The core paths import nothing of the notebook side; each feature that needs it
says in one line which extra to install, never a bare ModuleNotFoundError; `live=None` in a
kernel without the widgets falls back to the log lines.

Absence is made real in a fresh interpreter: `sys.modules[name] = None` makes every import of
`name` fail, and `importlib.util.find_spec(name)` say it is not there. The fresh venv that holds
the core wheel only is tests/e2e/test_core_wheel.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from core_paths import WORKBOOK
from jupyter_client.manager import start_new_kernel

REPO = Path(__file__).resolve().parents[2]
HELPERS = REPO / "tests" / "helpers"

EXTRA = "pip install 'diagkit[workbook]'"


def run_script(code: str, cwd: Path) -> dict:
    """`code` in a fresh interpreter in `cwd`; the JSON object it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_core_paths_import_nothing_of_the_workbook(tmp_path):
    """Here the workbook is installed: the core paths work and never import it."""
    done = subprocess.run([sys.executable, str(HELPERS / "core_paths.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for path in ("steps", "whole", "diagnose"):
        assert got[path] == {"value": ["grad_not_cleared", "orphan"]}, got[path]
    assert "orphan" in got["printed"]["value"], got["printed"]
    assert got["check"] == {"value": {"code": 1, "findings": ["grad_not_cleared", "orphan"]}}
    assert got["imported"] == []


FEATURES = f"""
    import contextlib, io, json, sys
    for name in {WORKBOOK!r}:
        sys.modules[name] = None  # not installed: every import of it fails
    import torch, diagkit
    from diagkit.run.cli.commands import main
    got = {{}}

    def cli(*args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(args))
        return {{"code": code, "stderr": err.getvalue()}}

    def error(fn):
        try:
            fn()
        except diagkit.DiagkitError as exc:
            return str(exc)
        return None

    data = {str(REPO / "data")!r}
    got["report"] = cli("report", "diagkit.demos:clean", "--out", "r1")
    got["report_from"] = cli("report", "--from", "nowhere", "--out", "r2")
    got["demo"] = cli("demo", "--out", "r3")
    got["notebooks"] = cli("notebooks", "r4")
    got["compare_out"] = cli("compare", data + "/meta_memory_step2.pt",
                             data + "/meta_memory_step5.pt", "--out", "r5")
    got["made"] = sorted(str(p) for p in __import__("pathlib").Path(".").glob("r*"))
    got["compare"] = cli("compare", data + "/meta_memory_step2.pt",
                         data + "/meta_memory_step5.pt")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)

    def train(n):
        for _ in range(n):
            opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()

    got["live"] = error(lambda: diagkit.watch(model, opt, steps=2, live=True))
    got["report_true"] = error(lambda: diagkit.watch(model, opt, steps=2, out="saved",
                                                     report=True))
    w = diagkit.watch(model, opt, steps=2, out="saved")
    train(3)
    got["saved"] = str(diagkit.load("saved"))
    got["explore"] = error(lambda: diagkit.explore(w.diagnosis))
    got["plots"] = error(lambda: __import__("diagkit.present.plots"))
    from diagkit.run.workbook.compare import compare_checkpoints
    cmp = compare_checkpoints(data + "/meta_memory_step2.pt", data + "/meta_memory_step5.pt")
    got["comparison_html"] = "diagkit" in cmp._repr_html_()
    print(json.dumps(got))
"""


def test_each_feature_of_the_workbook_names_the_extra_in_one_line(tmp_path):
    got = run_script(FEATURES, tmp_path)
    needs = {"report": "diagkit report needs papermill, nbconvert, nbformat, ipykernel and "
                       "matplotlib",
             "report_from": "diagkit report needs", "demo": "diagkit demo needs",
             "notebooks": "diagkit notebooks needs ipykernel, matplotlib and ipywidgets",
             "compare_out": "diagkit compare --out needs"}
    for command, words in needs.items():
        assert got[command]["code"] == 2, (command, got[command])
        (line,) = got[command]["stderr"].strip().splitlines()
        assert line.startswith(f"diagkit: error: {words}") and line.endswith(EXTRA), line
    assert got["made"] == []  # said before a target ran or a folder was made
    assert got["compare"]["code"] in (0, 1) and got["compare"]["stderr"] == ""
    assert got["live"] == ("live=True (the live view) needs IPython, ipywidgets and matplotlib: "
                           + EXTRA)
    assert got["report_true"] == ("report=True needs papermill, nbconvert, nbformat, ipykernel "
                                  "and matplotlib: " + EXTRA)  # said before training
    assert "orphan" in got["saved"]
    assert got["explore"] == f"diagkit.explore needs IPython, ipywidgets and matplotlib: {EXTRA}"
    assert got["plots"] == f"diagkit's plotting needs matplotlib: {EXTRA}"
    assert got["comparison_html"]  # a Comparison shows without matplotlib


# ---------------------------------------------------------------------- a real kernel
SETUP = """
import json, logging, sys, torch, diagkit
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
def train(n):
    for _ in range(n):
        opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
w = diagkit.watch(model, opt, steps=2)  # the widgets installed: the panel is shown
train(3)
w.live.join(60)
print(json.dumps({"shown": w.live is not None}))
"""
WITHOUT = """
for name in ("ipywidgets", "matplotlib"):
    sys.modules[name] = None  # as if not installed (imported above: now they are not found)
w = diagkit.watch(model, opt, steps=None)  # live=None: the whole run
train(6)
w.stop()
try:
    diagkit.watch(model, opt, steps=2, live=True)
    asked = None
except diagkit.DiagkitError as exc:
    asked = str(exc)
print(json.dumps({"shown": w.live is not None, "asked": asked}))
"""


def run_in_kernel(cells: list[str]) -> list[dict]:
    """Each cell in a new Jupyter kernel (ipykernel, through jupyter_client), in order: what
    each printed (its last line as JSON) and wrote on stderr."""
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        outputs = []
        for cell in cells:
            out, err = [], []

            def hook(msg):
                content = msg["content"]
                if msg["msg_type"] == "stream":
                    (err if content["name"] == "stderr" else out).append(content["text"])
                elif msg["msg_type"] == "error":
                    err.append("\n".join(content["traceback"]))
            reply = client.execute_interactive(cell, timeout=240, output_hook=hook)
            assert reply["content"]["status"] == "ok", "".join(err)
            outputs.append({**json.loads("".join(out).strip().splitlines()[-1]),
                            "stderr": "".join(err)})
        return outputs
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_live_none_in_a_kernel_without_the_widgets_falls_back_to_the_log_lines():
    with_widgets, without = run_in_kernel([SETUP, WITHOUT])
    assert with_widgets["shown"]  # a kernel: with the widgets, the panel
    assert not without["shown"]   # without them, no panel and no error:
    assert "live view" not in without["stderr"]
    lines = without["stderr"].strip().splitlines()  # the whole run's log lines, as outside one
    assert any(line.startswith("diagkit: error: orphan in 1 (2 tensors) from step 0; fix: ")
               for line in lines), lines
    assert without["asked"] == ("live=True (the live view) needs ipywidgets and matplotlib: "
                                + EXTRA)
