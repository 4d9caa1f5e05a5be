"""`import diagkit` is cheap (issue 21, section 5): it loads neither pandas nor the plotting,
widget and notebook stacks, yet every public name resolves; `diagkit.watch` on a plain model
never loads matplotlib, ipywidgets or papermill (they are for rendering). Each check runs in a
fresh interpreter, where nothing was imported before. The time is measured by `make bench`
(benchmarks/README.md, "Import")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("pandas", "matplotlib", "ipywidgets", "papermill")


def fresh(code: str) -> dict:
    """Run `code` in a new interpreter; it prints one JSON object, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_diagkit_loads_none_of_the_heavy_modules_and_every_name_resolves():
    got = fresh(f"""
        import json, sys
        import diagkit
        heavy = [m for m in {HEAVY!r} if m in sys.modules]
        from diagkit import watch, diagnose, Diagnosis, DiagkitError
        from diagkit.core.result import Diagnosis as D, Finding, load
        from diagkit.judge.verdicts import VERDICTS
        from diagkit.run.target import Setup, load_target
        import diagkit.run.watch, diagkit.run.api
        same = (diagkit.Diagnosis is D and diagkit.Finding is Finding and diagkit.load is load
                and diagkit.VERDICTS is VERDICTS and diagkit.Setup is Setup
                and diagkit.load_target is load_target and watch is diagkit.run.watch.watch
                and diagnose is diagkit.run.api.diagnose)
        try:
            diagkit.no_such_name
            missing = "no error"
        except AttributeError as exc:
            missing = str(exc)
        print(json.dumps({{"heavy": heavy, "all": diagkit.__all__, "dir": dir(diagkit),
                          "resolved": all(getattr(diagkit, n) is not None
                                          for n in diagkit.__all__),
                          "same": same, "version": diagkit.__version__, "missing": missing}}))
    """)
    assert got["heavy"] == []
    assert got["all"] == ["watch", "diagnose", "load_target", "Setup", "Diagnosis", "Finding",
                          "load", "VERDICTS", "DiagkitError", "__version__"]
    assert set(got["all"]) <= set(got["dir"])
    assert got["resolved"] and got["same"] and got["version"]
    assert got["missing"] == "module 'diagkit' has no attribute 'no_such_name'"


def test_watch_on_a_tiny_model_loads_no_rendering_module():
    got = fresh(f"""
        import json, sys
        import torch
        import diagkit
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = diagkit.watch(model, opt, steps=2)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(4, 3)).pow(2).mean().backward()
            opt.step()
        verdicts = {{n: sorted(v) for n, v in w.diagnosis.verdicts().items()}}
        print(json.dumps({{"loaded": [m for m in {HEAVY[1:]!r} if m in sys.modules],
                          "verdicts": verdicts}}))
    """)
    assert got["verdicts"] == {"weight": ["ok"], "bias": ["ok"]}
    assert got["loaded"] == []
