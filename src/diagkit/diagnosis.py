"""The result object: the two tables, the findings, the advice; saved and loaded whole."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import DiagkitError
from .findings import Finding, worst_severity
from .recorder import StepFailure
from .schema import SEVERITY_RANK, TUPLE_COLUMNS

FORMAT_VERSION = 1


@dataclasses.dataclass
class Diagnosis:
    params: pd.DataFrame
    steps: pd.DataFrame
    findings: list[Finding]
    advice: dict
    failure: StepFailure | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    checkpoint: dict | None = None  # {"load": load report, "audit": dead bytes} when one was loaded

    # ---------------------------------------------------------------- queries
    def verdicts(self) -> dict[str, set[str]]:
        return {name: set(v) for name, v in zip(self.params["name"], self.params["verdicts"])}

    def worst(self) -> str | None:
        """Highest severity among the findings, or None when all is ok."""
        return worst_severity(self.findings)

    def fails(self, fail_on: str) -> bool:
        worst = self.worst()
        return worst is not None and SEVERITY_RANK[worst] >= SEVERITY_RANK[fail_on]

    def to_json_dict(self) -> dict:
        return {
            "params": records(self.params),
            "findings": [f.to_dict() for f in self.findings],
            "advice": self.advice,
            "failure": dataclasses.asdict(self.failure) if self.failure else None,
            "meta": self.meta,
            "checkpoint": self.checkpoint,
        }

    # ---------------------------------------------------------------- files
    def save(self, directory) -> Path:
        """Write everything atomically: a reader sees the old folder or the complete new one."""
        target = Path(directory)
        check_replaceable_dir(target, marker="run.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _to_parquet(self.params, tmp / "params.parquet")
            _to_parquet(self.steps, tmp / "steps.parquet")
            _write_json(tmp / "findings.json", [f.to_dict() for f in self.findings])
            _write_json(tmp / "advice.json", self.advice)
            _write_json(tmp / "run.json", {
                "format": FORMAT_VERSION, "meta": self.meta, "checkpoint": self.checkpoint,
                "failure": dataclasses.asdict(self.failure) if self.failure else None})
            replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    # ---------------------------------------------------------------- notebook
    def _repr_html_(self) -> str:
        """The notebook summary: the report's banner, findings and advice."""
        from .tables import advice_html, findings_table, verdict_banner
        return (f"<div class='diagkit'>{verdict_banner(self)}{findings_table(self.findings)}"
                f"{advice_html(self.advice)}</div>")

    def __repr__(self) -> str:
        return (f"<Diagnosis {len(self.params)} tensors, {self.meta.get('steps_observed', 0)} "
                f"steps, {len(self.findings)} findings, worst={self.worst()}>")


def load(directory) -> Diagnosis:
    """Read a folder written by `Diagnosis.save`."""
    folder = Path(directory)
    if not (folder / "run.json").is_file():
        raise DiagkitError(f"{folder} is not a saved diagnosis (no run.json)")
    run = json.loads((folder / "run.json").read_text())
    failure = StepFailure(**run["failure"]) if run.get("failure") else None
    return Diagnosis(
        params=_from_parquet(folder / "params.parquet"),
        steps=_from_parquet(folder / "steps.parquet"),
        findings=[Finding.from_dict(d) for d in
                  json.loads((folder / "findings.json").read_text())],
        advice=json.loads((folder / "advice.json").read_text()),
        failure=failure,
        meta=run.get("meta", {}),
        checkpoint=run.get("checkpoint"),
    )


# -------------------------------------------------------------------- helpers
def check_replaceable_dir(target: Path, marker: str) -> None:
    """Refuse to replace anything but an empty folder or one we wrote (it holds `marker`)."""
    target = Path(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise DiagkitError(f"{target} exists and is not a folder; choose another output folder")
    if any(target.iterdir()) and not (target / marker).is_file():
        raise DiagkitError(f"{target} is a non-empty folder that diagkit did not write "
                           f"(no {marker}); choose a new or empty folder")


def replace_dir(tmp: Path, target: Path) -> None:
    """Swap a fully written folder into place."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def write_json_atomic(path, payload) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(to_jsonable(payload), fh, indent=2, allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_json(path: Path, payload) -> None:
    path.write_text(json.dumps(to_jsonable(payload), indent=2, allow_nan=False))


def to_jsonable(obj):
    """Strict JSON: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if obj is None or obj is pd.NA:
        return None
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, str):
        return obj
    return str(obj)


def records(df: pd.DataFrame) -> list[dict]:
    return [to_jsonable(row) for row in df.to_dict(orient="records")]


def _to_parquet(df: pd.DataFrame, path: Path) -> None:
    out = df.copy()
    for col in TUPLE_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda t: json.dumps(list(t)))
    out.to_parquet(path, index=False)


def _from_parquet(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    for col in TUPLE_COLUMNS:
        if col in df:
            df[col] = df[col].map(lambda s: _as_tuple(json.loads(s)))
    return df


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value
