"""The `diagkit` console script. Exit codes: 0 clean, 1 findings at or above --fail-on, 2 bad
usage or bad input (one line on stderr, never a traceback), 130 / 143 interrupted by SIGINT /
SIGTERM (`signals`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ...core import severity
from ...core import extras
from ...core.errors import DiagkitError
from ...core.files import check_output
from ...core.format import one_line
from ...core.options import DEFAULTS, DELTA_MODES, HELP, check_meta_options, check_option
from ..target import signals
from ..diagnose.check_outputs import check_outputs, stdout_for_json, unwritten_line
from ..target.cli_run import bounded as _bounded, import_timeout as _import_timeout
from ..target.cli_run import parse_target_args as _parse_target_args
from ..target.cli_run import precheck_target as _precheck_target
from ..target.cli_run import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from ..target.cli_run import check_notebook_text as _check_notebook_text
from ..target.cli_run import report_exit as _report_exit, safe_console as _safe_console
from ..target.deadline import TimedOut
from ..target.paths import check_lookup

# What only running a target uses (dest -> flag): refused with `report --from DIR`.
_RUN_ONLY = {"arg": "--arg", "steps": "--steps", "delta": "--delta", "every": "--every",
             "checkpoint": "--checkpoint", "trust_checkpoint": "--trust-checkpoint",
             "nproc": "--nproc", "timeout": "--timeout", "meta": "--meta",
             "try_fix": "--try-fix"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message by default)
        raise DiagkitError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diagkit",
                     description="Find mis-wired parameters in PyTorch training.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    check = sub.add_parser("check", help="diagnose a target and print its findings")
    _target_options(check)
    check.add_argument("--json", metavar="PATH", help="write params, findings and advice as JSON")
    check.add_argument("--save", metavar="DIR", help="save the whole diagnosis (diagkit.load)")

    report = sub.add_parser("report", help="execute the diagnosis notebook and render HTML "
                                           "(of a run of TARGET, or of a saved diagnosis)")
    _target_options(report, target_nargs="?")
    report.add_argument("--from", dest="saved", metavar="DIR",
                        help="render the diagnosis saved in DIR (check --save, Diagnosis.save) "
                             "instead of running a TARGET")
    report.set_defaults(**dict.fromkeys(_RUN_ONLY))  # None: tells a given flag from a default
    report.add_argument("--out", metavar="DIR", required=True,
                        help="folder for report.html, report.ipynb, params.csv, steps.csv, "
                             "findings.json")
    report.add_argument("--show-code", action="store_true", help="show the notebook's code")

    compare = sub.add_parser("compare", help="what changed between two checkpoints")
    compare.add_argument("checkpoint_a", metavar="CKPT_A", help="the earlier checkpoint")
    compare.add_argument("checkpoint_b", metavar="CKPT_B", help="the later checkpoint")
    compare.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    compare.add_argument("--out", metavar="DIR",
                         help="also render notebooks/compare_checkpoints.ipynb to DIR/report.html")
    compare.add_argument("--trust-checkpoint", action="store_true",
                         help="allow files that need arbitrary unpickling (runs their code)")
    compare.add_argument("--fail-on", choices=severity.FAIL_ON, default=DEFAULTS["fail_on"],
                         help="exit 1 when a finding is at or above this severity")
    compare.add_argument("--timeout", type=_option("timeout"), metavar="SECONDS",
                         help="end the comparison (and its --out report) after this many "
                              "seconds (default: none)")

    demo = sub.add_parser("demo", help="the report on the bundled demo targets")
    demo.add_argument("--out", metavar="DIR", default="out/demo", help="report folder")
    demo.add_argument("--steps", type=_option("steps"), default=DEFAULTS["steps"], metavar="N",
                      help=HELP["steps"])
    demo.add_argument("--show-code", action="store_true", help="show the notebook's code")
    demo.add_argument("--timeout", type=_option("timeout"), default=DEFAULTS["timeout"],
                      metavar="SECONDS", help="bound each demo's run (default: %(default)s s)")

    books = sub.add_parser("notebooks", help="copy the notebooks diagkit ships into DIR")
    books.add_argument("dir", metavar="DIR", help="folder to copy them into (made if missing)")
    books.add_argument("--force", action="store_true", help="replace notebooks already there")
    return parser


def _target_options(p: argparse.ArgumentParser, target_nargs=None) -> None:
    p.add_argument("target", nargs=target_nargs,
                   help="'package.module:function' or 'path/to/file.py:function'")
    p.add_argument("--arg", action="append", default=[], metavar="K=V",
                   help="keyword argument for the target function (repeatable); V is a Python "
                        "literal or a plain string")
    p.add_argument("--steps", type=_option("steps"), metavar="N",
                   help=f"{HELP['steps']} (default: the target's, else {DEFAULTS['steps']})")
    p.add_argument("--delta", choices=DELTA_MODES, default=DEFAULTS["delta"], help=HELP["delta"])
    p.add_argument("--every", type=_option("every"), default=DEFAULTS["every"], metavar="K",
                   help=HELP["every"])
    p.add_argument("--checkpoint", metavar="PATH",
                   help="load this checkpoint into the model first (weights_only=True): a "
                        "file, a Hugging Face sharded folder or index, or a "
                        "torch.distributed.checkpoint folder")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary unpickling (runs its code)")
    p.add_argument("--nproc", type=_option("nproc"), default=DEFAULTS["nproc"], metavar="N",
                   help="processes of a torch.distributed job launched with torchrun (gloo on "
                        "CPU, NCCL on GPUs); 1 = this process")
    p.add_argument("--timeout", type=_option("timeout"), metavar="SECONDS",
                   help=f"{HELP['timeout']} (default: none in one process, "
                        f"{DEFAULTS['timeout']} s with --nproc)")
    p.add_argument("--meta", action="store_true", default=DEFAULTS["meta"], help=HELP["meta"])
    p.add_argument("--try-fix", action="store_true", help=HELP["try_fix"])
    p.add_argument("--fail-on", choices=severity.FAIL_ON, default=DEFAULTS["fail_on"],
                   help="exit 1 when a finding is at or above this severity (default: error)")


def _option(name: str):
    """An argparse type for option `name`: an int that passes the option's check."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}"
                                             ) from None
        return check_option(name, value, "the value", error=argparse.ArgumentTypeError)
    parse.__name__ = name  # argparse names the type in its message
    return parse


def main(argv: list[str] | None = None) -> int:
    _safe_console()  # a console that cannot show "→" gets "->", not a UnicodeEncodeError
    try:
        with signals.handled():  # SIGTERM cleans up as Ctrl-C does
            return _run(argv)
    except (DiagkitError, TimedOut) as exc:  # TimedOut: --timeout outside a run's steps
        print(f"diagkit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: every `finally` has run
        signals.ignore_more()
        code, line = signals.exit_code(exc)
        print(f"diagkit: {line}", file=sys.stderr)
        return code
    except Exception as exc:  # a diagkit bug: still one line, the traceback on request
        if os.environ.get("DIAGKIT_DEBUG"):
            raise
        print(f"diagkit: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(set DIAGKIT_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return EXIT_USAGE


def _run(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from ...core.version import VERSION
        print(VERSION)
        return EXIT_OK
    if args.command is None:
        raise DiagkitError("missing command: use 'diagkit check TARGET' or 'diagkit demo' "
                           "(see 'diagkit --help')")
    _need_workbook(args)
    if args.command == "notebooks":
        check_lookup(args.dir, "notebooks folder")
        from ..workbook.shipped_notebooks import command
        return command(args)
    if args.command == "compare":
        from ..workbook.compare import command
        return command(args)
    return {"check": _check, "report": _report, "demo": _demo}[args.command](args)


def _need_workbook(args) -> None:
    """The commands that execute or copy a notebook need the workbook extra: said first, in
    one line, before a target is imported or a folder made (README, "Install")."""
    if args.command in ("report", "demo"):
        extras.need(extras.REPORT, f"diagkit {args.command}")
    elif args.command == "compare" and args.out:
        extras.need(extras.REPORT, "diagkit compare --out")
    elif args.command == "notebooks":
        extras.need(extras.NOTEBOOKS, "diagkit notebooks")


def _diagnose_target(args):
    """Run a target: validate everything first (before a possibly long run), then diagnose."""
    for option in ("json", "save"):
        check_output(getattr(args, option, None), f"--{option}")
    kwargs = _parse_target_args(args.arg)
    check_meta_options(args.meta, nproc=args.nproc, checkpoint=args.checkpoint,
                       label="--{}".format)
    _precheck_target(args.target, kwargs, args.checkpoint, _import_timeout(args))
    from ..diagnose.api import run_target
    from ..diagnose.pipeline import judge_observation
    with _bounded(args, lambda obs: check_outputs(args, judge_observation(obs))):
        return run_target(args.target, kwargs, steps=args.steps, checkpoint=args.checkpoint,
                          trust_checkpoint=args.trust_checkpoint, nproc=args.nproc,
                          timeout=args.timeout or DEFAULTS["timeout"], delta=args.delta,
                          every=args.every, meta=args.meta)


def _check(args) -> int:
    if args.try_fix:  # the fix preview (`run.diagnose.try_fix`)
        from ..diagnose.try_fix import command
        return command(args)
    with stdout_for_json(args):  # `--json -`: standard output holds the JSON alone
        diag = _diagnose_target(args)
    unwritten = check_outputs(args, diag)
    problems = [unwritten_line(args, unwritten)] if unwritten else []
    if diag.meta.get("timed_out"):  # the steps before it are judged and written: still exit 2
        problems.insert(0, f"{diag.failure.error}; the {diag.meta['steps_observed']} steps "
                           "completed before it are kept")
    if problems:
        raise DiagkitError("; ".join(problems))
    return EXIT_FINDINGS if diag.fails(args.fail_on) else EXIT_OK


def _report(args) -> int:
    """`report TARGET` runs the target in the notebook; `report --from DIR` renders a saved
    diagnosis with the same notebook, so a run on a GPU node is explored later, offline."""
    if args.saved is not None:
        return _report_saved(args)
    if args.target is None:
        raise DiagkitError("report needs a TARGET to run, or --from DIR to render a saved "
                           "diagnosis")
    check_output(args.out, "--out")
    kwargs = _parse_target_args(args.arg or [])
    check_meta_options(bool(args.meta), nproc=args.nproc or DEFAULTS["nproc"],
                       checkpoint=args.checkpoint, label="--{}".format)
    _precheck_target(args.target, kwargs, args.checkpoint, _import_timeout(args))
    params = {"target": args.target, "target_args": kwargs, "checkpoint": args.checkpoint or "",
              "trust_checkpoint": bool(args.trust_checkpoint)}
    # only what was given: the rest keep the notebook's defaults (no --steps: the target's)
    params.update({name: getattr(args, name) for name in ("steps", "nproc", "timeout", "delta",
                                                          "every", "meta", "try_fix")
                   if getattr(args, name) is not None})
    _check_notebook_text(params)
    from ..workbook.report import write_report
    with _bounded(args):
        result = write_report(args.out, {args.target: params}, show_code=args.show_code,
                              title=f"diagkit report: {args.target}")
    return _report_exit(result, args.fail_on)


def _report_saved(args) -> int:
    """Render a saved diagnosis: checked whole here, before a kernel starts or OUT exists."""
    if args.target is not None:
        raise DiagkitError(f"give a TARGET to run ({args.target}) or --from DIR to render a "
                           "saved diagnosis, not both")
    given = [flag for dest, flag in _RUN_ONLY.items() if getattr(args, dest) is not None]
    if given:
        raise DiagkitError(f"{', '.join(given)}: only for running a TARGET; --from renders "
                           "the saved diagnosis as it was run")
    check_lookup(args.saved, "--from")
    check_output(args.out, "--out")
    saved, out = Path(args.saved), Path(args.out)
    if saved.exists() and out.exists() and os.path.samefile(saved, out):
        raise DiagkitError(f"--out {args.out} is the saved diagnosis itself: choose another")
    from ..workbook.notebook import load_saved
    load_saved(args.saved)
    from ..workbook.report import write_report
    result = write_report(args.out, {args.saved: {"diagnosis": args.saved}},
                          show_code=args.show_code, title=f"diagkit report: {args.saved}")
    return _report_exit(result, args.fail_on)


def _demo(args) -> int:
    check_output(args.out, "--out")
    from ...demos import DEMOS
    from ..workbook.report import write_report
    sections = {f"diagkit.demos:{name}": {"target": f"diagkit.demos:{name}",
                                          "steps": args.steps} for name in DEMOS}
    with _bounded(args):  # the demos are small: each run is bounded by default
        result = write_report(args.out, sections, show_code=args.show_code,
                              title="diagkit demo report")
    return _report_exit(result, "never")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
