"""Running a target from the command line: its `--arg K=V` pairs, the checks made before a
kernel or a run starts, and the `--timeout` bound of a run in this process; the exit codes, a
report's exit, and a console that any text can be printed to."""

from __future__ import annotations

import ast
import codecs
import contextlib
import json
import sys

from ...core import severity
from ...core.errors import DiagkitError
from ...core.options import DEFAULTS

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

# What the printed text uses beyond ASCII, as a console that cannot show it reads it best.
_ASCII = {"→": "->", "←": "<-", "≤": "<=", "≥": ">=", "≠": "!=", "≈": "~", "±": "+-",
          "×": "x", "−": "-", "‖": "||", "Δ": "delta", "·": "-", "—": "--", "–": "-",
          "…": "...", "‘": "'", "’": "'", "“": '"', "”": '"', "•": "*", "✓": "v", "✗": "x"}
_FALLBACK = "diagkit-ascii"


def _fallback(exc: UnicodeError):
    """The codec error handler of `safe_console`: each character the console's encoding
    cannot show as its ASCII spelling, else escaped (`\\u2192`, a file name's stray byte
    `\\udcff`): the text stays readable, and nothing is lost or raises."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start:exc.end]
    return "".join(_ASCII.get(ch) or ch.encode("ascii", "backslashreplace").decode("ascii")
                   for ch in text), exc.end


def safe_console() -> None:
    """stdout and stderr print any text: under `PYTHONIOENCODING=ascii` or a Latin-1 locale,
    the findings' "→" and "≤" would end the command in a UnicodeEncodeError (an "internal
    error", the output lost); a checkpoint name that is not UTF-8 (kept as surrogates) would
    do it even on a UTF-8 console. Each such character is spelled in ASCII instead; text the
    console can show is unchanged."""
    codecs.register_error(_FALLBACK, _fallback)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # replaced, or closed
            stream.reconfigure(errors=_FALLBACK)


def check_notebook_text(params: dict) -> None:
    """A report's parameters are written into its notebook, which is UTF-8 text: a value that
    is not (a path whose name was saved under another locale: Python keeps its bytes as
    surrogates) cannot be, and papermill wrote an empty notebook that ended the command as an
    "internal error". Refused in one line, before a kernel starts."""
    for name, value in params.items():
        try:
            json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
        except UnicodeEncodeError:
            raise DiagkitError(f"{name} {value!r} is not UTF-8 text, which a report's "
                               "notebook must hold: rename it (or run check / compare "
                               "without --out)") from None


def report_exit(result, fail_on: str) -> int:
    """The exit code of a rendered report (`report.ReportResult`), and its one line."""
    if result.timed_out:
        print(f"diagkit: error: {result.timed_out}; the report shows the steps completed "
              f"before it: {result.html.resolve()}", file=sys.stderr)
        return EXIT_USAGE
    if result.error:
        print(f"diagkit: error: report incomplete ({result.error}); what ran is in "
              f"{result.html.resolve()}", file=sys.stderr)
        return EXIT_USAGE
    print(f"diagkit: report written to {result.html.resolve()}")
    if severity.fails(result.worst, fail_on):
        return EXIT_FINDINGS
    return EXIT_OK


def parse_target_args(pairs: list[str]) -> dict:
    """`k=v` pairs; v is a Python literal when it parses as one, else the plain string."""
    kwargs = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise DiagkitError(f"--arg {pair!r} is not of the form NAME=VALUE")
        try:
            kwargs[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            kwargs[key] = raw
    return kwargs


def bounded(args, on_hard_expiry=None):
    """`--timeout` for a run in this process, or in the kernel a report starts (`deadline`),
    when it is given: a run in one process has no bound by default, since building a large
    model or a slow step on a CPU can take minutes. Under --nproc the launcher bounds the run
    with the same option (default `DEFAULTS["timeout"]`: a rank that hangs)."""
    from . import deadline
    if (getattr(args, "nproc", None) or DEFAULTS["nproc"]) > 1 or args.timeout is None:
        return contextlib.nullcontext()
    return deadline.bound_runs(args.timeout, on_hard_expiry)


def import_timeout(args) -> float | None:
    """The bound of `precheck_target`'s import: `--timeout`, as for the run (under --nproc
    its default too, since the ranks are bounded by default)."""
    if (getattr(args, "nproc", None) or DEFAULTS["nproc"]) > 1:
        return args.timeout or DEFAULTS["timeout"]
    return args.timeout


def precheck_target(spec: str, kwargs: dict, checkpoint: str | None,
                    timeout: float | None = None) -> None:
    """Fail in one line before a kernel starts: the target must import and accept its args.
    `timeout`: the import's bound (`import_timeout`; a target that hangs at import is one line
    naming the phase, exit 2)."""
    from .paths import check_lookup
    from .spec import check_findable, split_spec
    where, _ = split_spec(spec)
    if where.endswith(".py"):
        check_lookup(where, "target file")  # a link loop, a name too long: the user's to fix
    check_findable(spec)  # a typo: one line before torch is imported
    from . import deadline
    from .target import check_kwargs, resolve_target
    with deadline.bound_import(timeout):
        fn = resolve_target(spec)
    check_kwargs(fn, spec, kwargs)
    if checkpoint:
        from ...measure.checkpoints.kind import locate
        locate(checkpoint)  # a missing path, or a folder that is no checkpoint: one line
