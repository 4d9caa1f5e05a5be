"""What a run hands back: `Diagnosis` and `Comparison`, with the `Finding`s, the `StepFailure`
and the `LoadReport` they hold. Built once, complete, by `diagkit.run.diagnose.pipeline` (or read back
by `load`); nothing appends to them afterwards.

A result shows itself through `_repr_html_` (a notebook) and `Diagnosis.__str__` (`print`), the
one place this layer reaches up (lazily, to `diagkit.present`): Python and IPython look for
those methods on the object itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from . import severity
from . import saved
from .files import check_replaceable_dir, json_text, records, to_jsonable, to_parquet
from .format import human_bytes
from .schema import FORMAT_VERSION, SCHEMA_VERSION
from .swap import write_dir_atomic



@dataclasses.dataclass(frozen=True)
class Finding:
    """One verdict (or run-level problem) over one module subtree, with a fix to paste.

    `since`, `until`, `ended`: when it held, for a watch over the whole run (docs/whole-run.md,
    "The whole run"). `source`: for a finding about optimizer membership, where the groups
    concerned were built, one dict per group: {"optimizer", "group", "class", "file", "line",
    "lines", "how", "call_line"}, from a callback also "function", "callers", and under the
    HF Trainer "lever", "lever_at" (with "rule", "chosen_by", "frozen_then", "absent_then"
    where that applies) (empty when diagkit did not see the optimizer built; see
    docs/targets.md, "Where the optimizer was built").
    """

    code: str
    severity: str
    params: tuple[str, ...]
    message: str
    fix: str
    module: str = ""
    count: int = 0
    bytes: int = 0
    source: tuple[dict, ...] = dataclasses.field(default=(), hash=False)
    # A whole-run watch's finding: the first and last observed step it held on, and the first
    # observed step it no longer held on (None: it still held at the end). None elsewhere.
    since: int | None = None
    until: int | None = None
    ended: int | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["params"] = list(self.params)
        d["source"] = [dict(s) for s in self.source]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        """Also reads a finding saved before `source` existed (it then has none), and one
        saved by a newer diagkit of the same format: fields this version does not know are
        ignored (docs/result.md, "Saved folders")."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known},
                      "params": tuple(d.get("params", ())),
                      "source": tuple(dict(s) for s in d.get("source") or ())})


def worst_severity(findings) -> str | None:
    """The highest severity among `findings` (None when there are none)."""
    return severity.worst(f.severity for f in findings)


@dataclasses.dataclass(frozen=True)
class StepFailure:
    """The user's step raised: which step, and what, so earlier steps can still be shown."""

    step: int
    error: str
    traceback: str


@dataclasses.dataclass
class LoadReport:
    """What loading a checkpoint into the model did, tensor by tensor."""

    path: str
    matched: list[str]
    missing: list[str]  # in the model, not in the file
    unexpected: list[str]  # in the file, not in the model
    mismatched: list[dict]  # same name, different shape (not loaded)
    dtype_cast: list[dict]  # same name and shape, different dtype (loaded, cast)
    file_bytes: dict[str, int]  # bytes of every tensor in the file, by model name
    optimizer: dict | None = None

    def table(self) -> pd.DataFrame:
        rows = [{"name": n, "status": "loaded"} for n in self.matched]
        rows += [{"name": n, "status": "missing from the file"} for n in self.missing]
        rows += [{"name": n, "status": "not in the model"} for n in self.unexpected]
        rows += [{"name": m["name"], "status": "shape mismatch (not loaded)",
                  "file": str(m["file"]), "model": str(m["model"])} for m in self.mismatched]
        rows += [{"name": m["name"], "status": "dtype cast", "file": m["file"],
                  "model": m["model"]} for m in self.dtype_cast]
        return pd.DataFrame(rows, columns=["name", "status", "file", "model"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        size = human_bytes(sum(self.file_bytes.get(n, 0) for n in self.matched))
        parts = [f"{len(self.matched)} tensors loaded ({size})"]
        for label, items in (("missing from the file", self.missing),
                             ("in the file but not the model", self.unexpected),
                             ("with another shape", self.mismatched),
                             ("cast to the model's dtype", self.dtype_cast)):
            if items:
                parts.append(f"{len(items)} {label}")
        opt = self.optimizer
        if opt is not None:
            parts.append("optimizer state " + (f"loaded ({len(opt['with_state'])} tensors with "
                                               f"state, {len(opt['without_state'])} without)"
                                               if opt["loaded"] else f"not loaded: {opt['why']}"))
        return f"checkpoint {self.path}: " + ", ".join(parts)


class _Judged:
    """What both results answer from their findings."""

    findings: list[Finding]

    def worst(self) -> str | None:
        """Highest severity among the findings, or None when all is ok."""
        return worst_severity(self.findings)

    def fails(self, fail_on: str) -> bool:
        """Whether a finding is at or above `fail_on` (the CLI's exit code 1)."""
        return severity.fails(self.worst(), fail_on)


@dataclasses.dataclass(frozen=True)
class Diagnosis(_Judged):
    """The two tables, the findings, the advice; saved and loaded whole.

    `checkpoint` is {"load": LoadReport.to_dict(), "audit": dead bytes, "summary": one line}
    when a checkpoint was loaded into the model first.
    """

    params: pd.DataFrame
    steps: pd.DataFrame
    findings: list[Finding]
    advice: dict
    failure: StepFailure | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    checkpoint: dict | None = None

    def verdicts(self) -> dict[str, set[str]]:
        return {name: set(v) for name, v in zip(self.params["name"], self.params["verdicts"])}

    def to_json_dict(self) -> dict:
        """What `diagkit check --json` writes (docs/result.md, "Schema version")."""
        return {
            "schema_version": SCHEMA_VERSION,
            "params": records(self.params),
            "findings": [f.to_dict() for f in self.findings],
            "advice": self.advice,
            "failure": dataclasses.asdict(self.failure) if self.failure else None,
            "meta": self.meta,
            "checkpoint": self.checkpoint,
        }

    def save(self, directory) -> Path:
        """Write everything atomically: a reader sees the old folder or the complete new one."""
        target = Path(directory)
        check_replaceable_dir(target, marker="run.json")
        return write_dir_atomic(target, self._write)

    def _write(self, folder: Path) -> None:
        to_parquet(self.params, folder / "params.parquet")
        to_parquet(self.steps, folder / "steps.parquet")
        _write_json(folder / "findings.json", [f.to_dict() for f in self.findings])
        _write_json(folder / "advice.json", self.advice)
        _write_json(folder / "run.json", {
            "format": FORMAT_VERSION, "schema_version": SCHEMA_VERSION, "meta": self.meta,
            "checkpoint": self.checkpoint,
            "failure": dataclasses.asdict(self.failure) if self.failure else None})

    def _repr_html_(self) -> str:
        from ..present.sections import diagnosis_html  # the display protocol: see the docstring
        return diagnosis_html(self)

    def __str__(self) -> str:
        """What `print(diagnosis)` shows: the findings with their fixes, as `diagkit check`
        prints them (the display protocol: see the module's docstring)."""
        from ..present.text import render_findings
        return render_findings(self)

    def __repr__(self) -> str:
        return (f"<Diagnosis {len(self.params)} tensors, {self.meta.get('steps_observed', 0)} "
                f"steps, {len(self.findings)} findings, worst={self.worst()}>")


def load(directory) -> Diagnosis:
    """Read a folder written by `Diagnosis.save`: a save of an older diagkit too; one of a
    newer format, or a damaged one, is a one-line DiagkitError (`diagkit.core.saved`)."""
    parts = saved.read(Path(directory))
    run = parts["run"]
    failure = run.get("failure")
    return Diagnosis(
        params=parts["params"], steps=parts["steps"],
        findings=[Finding.from_dict(d) for d in parts["findings"]],
        advice=parts["advice"],
        failure=StepFailure(**{k: failure[k] for k in ("step", "error", "traceback")})
        if failure else None,
        meta=run["meta"],
        checkpoint=run.get("checkpoint"),
    )


@dataclasses.dataclass(frozen=True)
class Comparison(_Judged):
    """Two checkpoints compared tensor by tensor (`table`), with findings and totals."""

    path_a: str
    path_b: str
    table: pd.DataFrame
    findings: list[Finding]
    summary: dict

    def to_json_dict(self) -> dict:
        """Strict JSON (NaN and inf become null): summary, one object per tensor, findings."""
        return to_jsonable({"schema_version": SCHEMA_VERSION, "summary": self.summary, "tensors": records(self.table),
                            "findings": [f.to_dict() for f in self.findings],
                            "worst": self.worst()})

    def _repr_html_(self) -> str:
        from ..present.comparison import comparison_html  # the display protocol
        return comparison_html(self)

    def __repr__(self) -> str:
        return (f"<Comparison {self.summary['tensors']} tensors, {self.summary['changed']} "
                f"changed, {self.summary['unchanged']} unchanged, worst={self.worst()}>")


def _write_json(path: Path, payload) -> None:
    path.write_text(json_text(payload))  # inside the scratch folder save() swaps in whole
