"""The notebook contract (SPEC 5): one typed `parameters` cell, no committed outputs, unknown
parameters rejected, and every notebook executes headless under papermill."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest
from papermill.exceptions import PapermillExecutionError

from diagkit import DiagkitError
from diagkit.core.options import DEFAULTS
from diagkit.run.workbook import compare, contract, notebook

NOTEBOOKS = sorted((Path(__file__).resolve().parents[3] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS if p.name == "diagnose.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_carry_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, path


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_one_parameters_cell_of_typed_commented_literals(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    lines = [line for line in tagged[0].source.splitlines() if line.strip()]
    tree = ast.parse(tagged[0].source)
    assert len(tree.body) == len(lines)  # one statement per line, nothing else
    first = tree.body[0]  # what the `Optional[...]` annotations need, and nothing more
    assert isinstance(first, ast.ImportFrom) and (first.module, [a.name for a in first.names]) \
        == ("typing", ["Optional"]), lines[0]
    for node, line in zip(tree.body[1:], lines[1:]):
        assert isinstance(node, ast.AnnAssign), line
        ast.literal_eval(node.value)  # a literal
        assert "#" in line.split("=", 1)[1], f"uncommented: {line}"


@pytest.mark.parametrize("name", [contract.DIAGNOSE, contract.COMPARE])
def test_the_parameters_cell_is_the_contract(name):
    nb = nbformat.read(next(p for p in NOTEBOOKS if p.name == name), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    declared = {n.target.id: (ast.unparse(n.annotation), ast.literal_eval(n.value))
                for n in ast.parse(cell.source).body if isinstance(n, ast.AnnAssign)}
    contract_of = contract.parameters(name)  # derived from that very cell
    assert list(declared) == list(contract_of)
    for param, (annotation, default) in declared.items():
        p = contract_of[param]
        names = [t.__name__ for t in p.types if t is not type(None)]
        spelled = f"Optional[{names[0]}]" if type(None) in p.types else names[0]
        assert len(names) == 1 and annotation == spelled and default == p.default, param
        assert p.help and p.help in cell.source, param  # the line's comment
        if param == "steps":  # None: the target's own steps, else DEFAULTS (resolve_steps)
            assert default is None
        elif param in DEFAULTS:  # an option the library knows: the same default everywhere
            assert default == DEFAULTS[param], param


@pytest.mark.parametrize("validate, bad, words", [
    (notebook.validate, {"bogus": 1}, ["unknown", "'bogus'", "target"]),
    (notebook.validate, {"steps": "5"}, ["'steps'", "int", "str"]),
    (notebook.validate, {"steps": 0}, ["'steps'", ">= 1"]),
    (notebook.validate, {"interactive": 1}, ["'interactive'", "bool"]),
    (notebook.validate, {"target_args": []}, ["'target_args'", "dict"]),
    (notebook.validate, {"steps": True}, ["'steps'", "int", "bool"]),
    (notebook.validate, {"delta": "fast"}, ["'delta'", "exact, sampled, off"]),
    (notebook.validate, {"diagnosis": 3}, ["'diagnosis'", "str or None", "int"]),
    (compare.validate, {"stepz": 1}, ["unknown", "'stepz'", "checkpoint_a, checkpoint_b"]),
    (compare.validate, {"checkpoint_a": None}, ["'checkpoint_a'", "must be str", "NoneType"]),
    (compare.validate, {"trust_checkpoint": "yes"}, ["'trust_checkpoint'", "bool", "str"]),
])
def test_validate_rejects_bad_parameters(validate, bad, words):
    with pytest.raises(DiagkitError) as info:
        validate(bad)
    for word in words:
        assert word in str(info.value)


def test_validate_fills_defaults():
    settings = notebook.validate({"target": "x:y"})
    assert settings["target"] == "x:y" and settings["steps"] is None
    assert settings["checkpoint"] == ""


def _run(path, tmp_path, **parameters):
    out = tmp_path / f"out-{path.name}"
    return papermill.execute_notebook(str(path), str(out), parameters=parameters,
                                      kernel_name="python3", progress_bar=False,
                                      cwd=str(tmp_path))


# The workbook run headless on each demo, with its figures and written tables: the demo report
# (tests/run/workbook/test_report.py, `diagkit demo`) runs it through papermill once per demo.


DIAGNOSE = NOTEBOOKS[[p.name for p in NOTEBOOKS].index("diagnose.ipynb")]
TINY = {"diagnose.ipynb": {"steps": 1}}  # other notebooks run on their defaults
# A notebook whose run on its defaults, in a folder of its own, another module already makes
# and checks more closely: {notebook: (that module, the test)}.
EXECUTED_ELSEWHERE = {
    "compare_checkpoints.ipynb": ("e2e/test_compare_notebook.py",
                                  "test_notebook_runs_with_default_parameters"),
}


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name not in EXECUTED_ELSEWHERE],
                         ids=lambda p: p.name)
def test_every_notebook_executes_with_tiny_parameters(tmp_path, path):
    nb = _run(path, tmp_path, **TINY.get(path.name, {}))
    assert all(o.output_type != "error" for c in nb.cells for o in c.get("outputs", []))


def test_the_notebooks_executed_elsewhere_are_executed_there():
    """Each notebook left out above is run on its defaults, from a folder other than the
    repository, by the test named: that test exists and runs that notebook."""
    tests = Path(__file__).resolve().parents[2]
    for name, (module, test) in EXECUTED_ELSEWHERE.items():
        assert name in [p.name for p in NOTEBOOKS], name
        source = (tests / module).read_text()
        assert f"def {test}(" in source and f'"{name}"' in source, (module, test)
        body = source[source.index(f"def {test}("):]
        body = body[:body.index("\ndef ")]
        assert '"elsewhere"' in source and "_execute(" in body, (module, test)


def test_papermill_renders_a_saved_diagnosis_without_running(tmp_path, finetune):
    """The finetune demo's diagnosis, saved; the notebook's default target is another demo."""
    finetune.save(tmp_path / "saved")
    data = tmp_path / "data"
    nb = _run(DIAGNOSE, tmp_path, diagnosis="saved", out_dir=str(data),  # relative: from cwd
              interactive=False)
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 3
    shown = " ".join(str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert f">{tmp_path / 'saved'}</h1>" in shown  # found, and named first
    assert "a saved diagnosis, written 20" in shown and "(not run again)" in shown
    assert "cmim_decoder" in shown
    written = json.loads((data / "findings.json").read_text())
    assert written["findings"] == [f.to_dict() for f in finetune.findings]
    assert written["meta"] == finetune.meta and written["worst"] == "warning"


def test_papermill_refuses_target_and_diagnosis_together(tmp_path, clean):
    clean.save(tmp_path / "saved")
    with pytest.raises(PapermillExecutionError) as info:  # the default target, but passed
        _run(DIAGNOSE, tmp_path, target="diagkit.demos:meta_memory", diagnosis="saved")
    assert "DiagkitError" in info.value.ename and "not both" in info.value.evalue
    assert "\n" not in info.value.evalue.strip()


def test_diagnosis_with_the_default_target_is_no_conflict_but_another_target_is(
        tmp_path, monkeypatch):
    """In JupyterLab nothing is injected: a target other than the cell's default is 'set'."""
    monkeypatch.setenv("DIAGKIT_LAUNCH_DIR", str(tmp_path))
    (tmp_path / "saved").mkdir()
    default = contract.parameters(contract.DIAGNOSE)["target"].default
    settings = notebook.check_parameters({"target": default, "diagnosis": "saved"})
    assert settings["diagnosis"] == str(tmp_path / "saved")
    for namespace in ({"target": "mypkg.train:build", "diagnosis": "saved"},
                      {"In": [f"# Parameters\ntarget = {default!r}\ndiagnosis = 'saved'\n"],
                       "target": default, "diagnosis": "saved"}):
        with pytest.raises(DiagkitError, match="not both"):
            notebook.check_parameters(namespace)


def test_papermill_with_an_unknown_parameter_fails(tmp_path):
    path = next(p for p in NOTEBOOKS if p.name == "diagnose.ipynb")
    with pytest.raises(PapermillExecutionError) as info:
        _run(path, tmp_path, target="diagkit.demos:clean", stepz=2)
    assert "DiagkitError" in info.value.ename and "stepz" in info.value.evalue


def test_a_notebook_checks_itself_against_the_cell_it_ran(tmp_path, monkeypatch):
    """Inside a kernel the contract is the parameters cell in IPython's history, so a copied
    notebook works where the repository's copy is out of reach (an installed wheel)."""
    monkeypatch.setenv("DIAGKIT_NOTEBOOKS", str(tmp_path))  # no notebook there
    cell = 'steps: int = 5  # steps\nout_dir: str | None = ""  # where\n'
    history = ["", cell, "# Parameters\nsteps = 2\n", "settings = check(globals())"]
    settings = notebook.check_parameters({"In": history, "steps": 2, "out_dir": None})
    assert settings == {"steps": 2, "out_dir": None}
    with pytest.raises(DiagkitError, match="'stepz'"):
        notebook.check_parameters({"In": history + ["# Parameters\nstepz = 2\n"], "steps": 2})
    with pytest.raises(DiagkitError, match="'steps' must be a positive int"):
        notebook.check_parameters({"In": history, "steps": 0})
    with pytest.raises(DiagkitError, match="not found"):
        notebook.check_parameters({})  # no history, no notebook: says where it looked


def test_the_docs_parameter_table_is_the_notebook_cell():
    """docs/workbook.md, "Parameters": the table is the cell, name for name, default for default."""
    page = (Path(__file__).resolve().parents[3] / "docs/workbook.md").read_text()
    section = page[page.index("\n## Parameters\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `(\w+)` \| `(.*?)` \| .* \|$", section, re.M)
    declared = contract.parameters(contract.DIAGNOSE)
    assert [name for name, _ in rows] == list(declared)
    for name, default in rows:
        assert ast.literal_eval(default) == declared[name].default, name


PAPERMILL = str(Path(sys.executable).parent / "papermill")


def cell_names(path) -> list[str]:
    """The names the parameters cell assigns, read with Python's own parser (not ours)."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return [n.target.id for n in ast.parse(cell.source).body if isinstance(n, ast.AnnAssign)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_help_notebook_lists_every_parameter(path, monkeypatch):
    """papermill reads the parameters cell with its own pattern, which knows `Optional[str]`
    but not `str | None`: a parameter it cannot read draws "Passed unknown parameter" on every
    run that passes it (`diagkit report` passes out_dir and steps). `papermill --help-notebook`
    is papermill's own command line run in this process (click's runner); its console script
    runs in a subprocess below (the documented headless command)."""
    from click.testing import CliRunner
    from papermill.cli import papermill as papermill_cli
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # what the command sets
    run = CliRunner().invoke(papermill_cli, ["--help-notebook", str(path)])
    assert run.exit_code == 0, (run.output, run.exception)
    listed = re.findall(r"^  (\w+): (\S+) \(default ", run.output, re.M)
    assert [name for name, _ in listed] == cell_names(path), run.output
    declared = contract.parameters(path.name)
    for name, shown in listed:  # the type papermill shows is the one diagkit validates
        optional = type(None) in declared[name].types
        assert shown.startswith("Optional[") == optional, (name, shown)


def test_the_documented_headless_command_draws_no_papermill_warning(tmp_path):
    """docs/workbook.md, "Interactive, headless, report": `papermill ... -p target ... -p steps N`
    (steps is `Optional[int]`: papermill used to warn that it is unknown)."""
    run = subprocess.run([PAPERMILL, str(DIAGNOSE), str(tmp_path / "out.ipynb"), "-p", "target",
                          "diagkit.demos:clean", "-p", "steps", "2", "-p", "interactive",
                          "False"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "unknown parameter" not in run.stderr, run.stderr  # (the kernel's own TCP notice
    # is ipykernel's, which `diagkit report` silences)


@pytest.mark.parametrize("bad, words", [
    ({"steps": "ten"}, "notebook parameter 'steps' must be int or None, got str 'ten'"),
    ({"out_dir": 3}, "notebook parameter 'out_dir' must be str or None, got int 3"),
])  # the compare notebook's other types: test_compare_notebook.py, check_parameters
def test_a_wrong_type_still_fails_the_notebook_in_one_line(tmp_path, bad, words):
    path = COMPARE if "checkpoint_a" in bad or "out_dir" in bad else DIAGNOSE
    with pytest.raises(PapermillExecutionError) as info:
        _run(path, tmp_path, **bad)
    assert info.value.ename == "DiagkitError" and words in info.value.evalue
    assert "\n" not in info.value.evalue.strip()


COMPARE = NOTEBOOKS[[p.name for p in NOTEBOOKS].index("compare_checkpoints.ipynb")]


@pytest.mark.parametrize("annotation, types", [
    ("Optional[int]", (int, type(None))),
    ("int | None", (int, type(None))),  # a notebook copied by an older diagkit
    ("Union[int, str]", (int, str)),
    ("str", (str,)),
])
def test_the_contract_reads_each_spelling_of_a_type(annotation, types):
    cell = f"from typing import Optional, Union  # types\nx: {annotation} = 1  # help\n"
    assert contract.parse_cell(cell)["x"].types == types
