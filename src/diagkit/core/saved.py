"""Reading a saved diagnosis back (`diagkit.load`, `report --from`, `diagkit.explore`), and
saying in one line why a folder cannot be (docs/result.md, "Saved folders"):

- a save of a newer format is refused: "upgrade diagkit";
- damage (a truncated table, a file that is not JSON, a field of the wrong type, a missing
  file) is named as damage, with the file;
- a save of an older diagkit is read, the columns added since getting the value they meant
  then; a finding's fields this version does not know (a newer diagkit's, same format) are
  ignored, so an older diagkit still reads what a newer one saved.

A folder being replaced by a save is read whole from one folder (its files are opened relative
to the folder first opened, never half from the old and half from the new), and read again
when that folder was swapped away meanwhile.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import severity
from .errors import DiagkitError
from .files import from_parquet
from .paths import reason
from .format import brief
from .schema import FORMAT_VERSION, PARAMS_COLUMNS, STEPS_COLUMNS
from .swap import recover

TRIES = 3  # reads of a folder that a save replaced while it was read
# Columns added after format 1, with the value each meant in a save from before it existed.
ADDED = {"params": {"placement": "", "stage": "", "skipped_steps": 0},
         "steps": {"skipped": False}}


class _Unreadable(DiagkitError):
    """A read that failed: damage, unless the folder was replaced while it was read."""


def read(folder: Path) -> dict:
    """The parts of the diagnosis saved in `folder`, checked: `run` (run.json: `meta`,
    `failure`, `checkpoint`), `params`, `steps`, `findings` (dicts), `advice`."""
    folder = Path(folder)
    recover(folder)
    for attempt in range(TRIES):
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            what = "is not a folder" if os.path.lexists(folder) else "does not exist"
            raise DiagkitError(f"saved diagnosis {folder} {what}") from None
        except OSError as exc:
            raise DiagkitError(f"saved diagnosis {folder} cannot be read: {reason(exc)}"
                               ) from None
        try:
            return _read(_Folder(fd, folder))
        except _Unreadable:
            if not _replaced(fd, folder):
                raise
        finally:
            os.close(fd)
        time.sleep(0.1 * (attempt + 1))
    raise DiagkitError(f"saved diagnosis {folder} was replaced {TRIES} times while being "
                       "read: try again")


def _replaced(fd: int, folder: Path) -> bool:
    """Whether `folder` names another folder than the one opened as `fd` (a save swapped it)."""
    try:
        return not os.path.samestat(os.fstat(fd), os.stat(folder))
    except OSError:
        return True


class _Folder:
    """The files of one opened folder, each read whole or named as damaged."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def damaged(self, name: str, what: str) -> _Unreadable:
        return _Unreadable(f"saved diagnosis {self.path} is corrupt: {name} {what}")

    def open(self, name: str, missing: str | None = None):
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=self.fd)
        except FileNotFoundError:
            raise (_Unreadable(missing) if missing else self.damaged(name, "is missing")
                   ) from None
        except OSError as exc:  # a permission, not damage
            raise DiagkitError(f"saved diagnosis {self.path}: cannot read {name} "
                               f"({reason(exc)})") from None
        return os.fdopen(fd, "rb")

    def json(self, name: str, missing: str | None = None):
        with self.open(name, missing) as fh:
            try:
                return json.loads(fh.read())
            except ValueError as exc:  # not JSON, or not UTF-8
                raise self.damaged(name, f"is not JSON ({brief(exc, 120)})") from None

    def table(self, name: str, columns: dict, added: dict):
        import pyarrow as pa
        with self.open(name) as fh:
            try:
                table = from_parquet(fh)
            except (ValueError, TypeError, KeyError, OSError, pa.ArrowException) as exc:
                raise self.damaged(name, f"is not a readable table ({type(exc).__name__}: "
                                         f"{brief(exc, 120)})") from None
        if not len(table.columns):  # a table saved empty, with no columns
            return table
        for column, value in added.items():  # nothing read needs a second path
            if column not in table.columns:
                table[column] = value
        lacks = [c for c in columns if c not in table.columns]
        if lacks:
            raise self.damaged(name, f"is incomplete: its {name.partition('.')[0]} table "
                                     f"lacks {', '.join(lacks[:5])}")
        return table


def _read(f: _Folder) -> dict:
    run = f.json("run.json", missing=f"{f.path} is not a saved diagnosis (no run.json)")
    if not isinstance(run, dict):
        raise f.damaged("run.json", "is not a JSON object")
    fmt = run.get("format")
    if not _count(fmt) or fmt < 1:
        raise f.damaged("run.json", f"has no format number (format: {fmt!r})")
    if fmt > FORMAT_VERSION:  # not damage: not to be read again, nor guessed at
        raise DiagkitError(f"saved diagnosis {f.path} was saved by a newer diagkit (format "
                           f"{fmt}; this one reads ≤ {FORMAT_VERSION}): upgrade diagkit")
    _check_run(run, f)
    findings = f.json("findings.json")
    _check_findings(findings, f)
    advice = f.json("advice.json")
    if not isinstance(advice, dict):
        raise f.damaged("advice.json", "is not a JSON object")
    return {"run": run, "findings": findings, "advice": advice,
            "params": f.table("params.parquet", PARAMS_COLUMNS, ADDED["params"]),
            "steps": f.table("steps.parquet", STEPS_COLUMNS, ADDED["steps"])}


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v) -> bool:
    return isinstance(v, str)


def _records(**fields):
    """A check of a list of objects, each with `fields` (name -> check); others ignored."""
    return lambda v: isinstance(v, list) and all(
        isinstance(r, dict) and all(check(r.get(k)) for k, check in fields.items()) for r in v)


def _optional(check):
    return lambda v: v is None or check(v)


_LEVEL = severity.LEVELS.__contains__
# The fields of run.json's meta that what renders a saved diagnosis computes with (the
# others are shown as they are): field -> (what it must be, check).
_META = {
    "steps_observed": ("a count", _optional(_count)),
    "optimizer_steps": ("a count", _optional(_count)),
    "ended": ("text", _text),
    "timed_out": ("true or false", lambda v: isinstance(v, bool)),
    "not_judged": ("an object", lambda v: isinstance(v, dict)),
    "not_measured": ("an object", _optional(lambda v: isinstance(v, dict))),
    "events": ("a list of {step, what}", _optional(_records(step=_count, what=_text))),
    "timeline": ("a list of {code, severity, module, since, until, ended}",
                 _optional(_records(code=_text, severity=_LEVEL, module=_text, since=_count,
                                    until=_count, ended=_optional(_count)))),
}
_FAILURE = _records(step=_count, error=_text, traceback=_optional(_text))
# A finding's fields: name -> check (absent ones take the default of `Finding`).
_FINDING = {"code": _text, "message": _text, "fix": _text, "module": _text, "count": _count,
            "bytes": _count, "params": lambda v: isinstance(v, list) and all(map(_text, v)),
            "source": _records(), "since": _optional(_count), "until": _optional(_count),
            "ended": _optional(_count)}
_REQUIRED = ("code", "message", "fix")


def _check_run(run: dict, f: _Folder) -> None:
    meta = run.setdefault("meta", {})
    if not isinstance(meta, dict):
        raise f.damaged("run.json", "has a meta that is not a JSON object")
    for field, (what, check) in _META.items():
        if field in meta and not check(meta[field]):
            raise f.damaged("run.json", f"has meta {field} {brief(repr(meta[field]), 60)}, "
                                        f"not {what}")
    if run.get("failure") is not None and not _FAILURE([run["failure"]]):
        raise f.damaged("run.json", "has a failure that is not {step, error, traceback}")
    if not isinstance(run.get("checkpoint"), (dict, type(None))):
        raise f.damaged("run.json", "has a checkpoint that is not a JSON object")


def _check_findings(payload, f: _Folder) -> None:
    """Each finding with a severity this version ranks (an unknown one ranks as ok: a run
    saved with `"severity": "fatal"` would pass every `--fail-on` and exit 0), and its other
    fields of the right type; fields this version does not know are ignored."""
    if not isinstance(payload, list) or not all(isinstance(d, dict) for d in payload):
        raise f.damaged("findings.json", "must be a list of findings")
    for i, d in enumerate(payload):
        if d.get("severity") not in severity.LEVELS:
            raise f.damaged("findings.json", f"finding {i} ({d.get('code')!r}) has severity "
                                             f"{d.get('severity')!r}, not one of "
                                             f"{', '.join(severity.LEVELS)}")
        bad = [k for k in _REQUIRED if k not in d] + [
            k for k, check in _FINDING.items() if k in d and not check(d[k])]
        if bad:
            raise f.damaged("findings.json", f"finding {i} ({d.get('code')!r}): missing or "
                                             f"wrong {', '.join(bad)}")
