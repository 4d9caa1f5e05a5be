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
        from diagkit import watch, explore, diagnose, Diagnosis, DiagkitError
        from diagkit.core.result import Diagnosis as D, Finding, load
        from diagkit.judge.verdicts import VERDICTS
        from diagkit.run.target.target import Setup, load_target
        import diagkit.run.watch.watch, diagkit.run.diagnose.api, diagkit.run.workbook.explore
        same = (diagkit.Diagnosis is D and diagkit.Finding is Finding and diagkit.load is load
                and diagkit.VERDICTS is VERDICTS and diagkit.Setup is Setup
                and diagkit.load_target is load_target and watch is diagkit.run.watch.watch.watch
                and diagnose is diagkit.run.diagnose.api.diagnose
                and explore is diagkit.run.workbook.explore.explore)
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
    assert got["all"] == ["watch", "explore", "diagnose", "load_target", "Setup", "Diagnosis", "Finding",
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


def test_a_typo_on_the_command_line_is_refused_before_torch_is_imported(tmp_path):
    """Bad usage is one line at once: the console script checks its options, its outputs and
    the target's spec (its form, its file, its top-level package) before it imports torch,
    pandas or the target."""
    (tmp_path / "a_file").write_text("the user's\n")
    cases = [["check", "diagkit.demos.clean"], ["check", "no_such_package_xyz.train:build"],
             ["check", str(tmp_path / "missing.py") + ":build"],
             ["check", "diagkit.demos:clean", "--steps", "0"],
             ["check", "diagkit.demos:clean", "--json", str(tmp_path / "no" / "x.json")],
             ["report", "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")],
             ["report", "--from", str(tmp_path / "a_file"), "--out", str(tmp_path / "o")],
             ["demo", "--out", str(tmp_path / "a_file")]]
    got = fresh(f"""
        import contextlib, io, json, sys
        from diagkit.run.cli.commands import main
        out = []
        for argv in {cases!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = main(argv)
            out.append([code, err.getvalue()])
        print(json.dumps({{"runs": out, "loaded": [m for m in ("torch", "pandas", "numpy")
                                                    if m in sys.modules]}}))
    """)
    for (code, err), argv in zip(got["runs"], cases):
        assert code == 2 and err.startswith("diagkit: error: ") and err.count("\n") == 1, argv
    assert "no module named 'no_such_package_xyz.train'" in got["runs"][1][1]
    assert "no such file" in got["runs"][2][1]
    assert got["loaded"] == []


def test_a_kernel_reading_its_parameters_cell_loads_no_notebook_schema():
    """Every notebook kernel checks its own parameters against its parameters cell: reading
    that cell must not bring nbformat and jsonschema (~1.3 CPU s per kernel at import)."""
    got = fresh("""
        import json, sys
        from diagkit.run.workbook import contract
        names = {n: list(contract.parameters(n)) for n in (contract.DIAGNOSE, contract.COMPARE)}
        print(json.dumps({"names": names, "loaded": [m for m in ("nbformat", "jsonschema")
                                                     if m in sys.modules]}))
    """)
    assert got["loaded"] == []
    assert got["names"]["diagnose.ipynb"][0] == "target" and "steps" in got["names"]["diagnose.ipynb"]
    assert got["names"]["compare_checkpoints.ipynb"]
