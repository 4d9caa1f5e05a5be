"""Each option's default lives in `diagkit.core.options`: the library's signatures, the CLI's
flags and the notebooks' parameters cells all say the same."""

from __future__ import annotations

import inspect

import diagkit
from diagkit.core.options import DEFAULTS
from diagkit.run.workbook import contract
from diagkit.run.diagnose.api import run_target
from diagkit.run.cli.commands import build_parser


def test_library_defaults():
    for fn in (diagkit.diagnose, run_target):
        sig = inspect.signature(fn).parameters
        for name in set(sig) & set(DEFAULTS) - {"steps"}:
            assert sig[name].default == DEFAULTS[name], (fn.__name__, name)
        assert sig["steps"].default is None  # the target's own steps, else DEFAULTS["steps"]


def test_cli_defaults():
    args = build_parser().parse_args(["check", "x:y"])
    for name in ("delta", "every", "nproc", "fail_on"):
        assert getattr(args, name) == DEFAULTS[name], name
    assert args.steps is None  # the target's own steps, else DEFAULTS["steps"]
    assert args.timeout is None  # none in one process; DEFAULTS["timeout"] under --nproc
    assert build_parser().parse_args(["demo"]).steps == DEFAULTS["steps"]


def test_notebook_defaults():
    for notebook in (contract.DIAGNOSE, contract.COMPARE):
        for name, p in contract.parameters(notebook).items():
            if name == "steps":  # the target's own steps, else DEFAULTS["steps"] (resolve_steps)
                assert p.default is None, notebook
            elif name in DEFAULTS:
                assert p.default == DEFAULTS[name], (notebook, name)
