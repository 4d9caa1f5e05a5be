"""The every-tensor table and the per-module rollup, as pandas objects the notebook shows.

Problems come first (`diagkit.present.ranking`); names are escaped; numbers carry three
significant digits and bytes are human readable."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from ..core import severity
from ..core.format import dotted_breaks, fmt_number, fmt_shape, human_bytes
from ..judge.verdicts import VERDICTS, severity_of
from .html_text import keep_units
from .ranking import problems_first, row_severity, subtree_labels


def _numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce")


WIRING_COLUMNS = ("name", "verdicts", "requires_grad", "optimizer/group", "lr", "weight_decay",
                  "used", "changed", "grad_norm", "grad_total_norm", "update_ratio", "bytes",
                  "shape")  # no module_type: the name holds the module's path (params.csv has it)


def _fraction(part: pd.Series, whole: pd.Series) -> pd.Series:
    p = _numeric(part).fillna(0).astype(np.int64).astype(str)
    w = _numeric(whole).fillna(0).astype(np.int64).astype(str)
    return p + "/" + w


def _wiring_rows(params: pd.DataFrame, limit: int) -> tuple[np.ndarray, int]:
    """Positions to show (problems first) and how many were left out."""
    order = problems_first(params)
    flagged = (row_severity(params) != "ok").to_numpy()
    if len(params) <= limit:
        return order, 0
    problems = order[flagged[order]]
    room = max(limit - len(problems), 0)
    others = np.flatnonzero(~flagged)
    size = _numeric(params["bytes"]).fillna(0).to_numpy()[others]
    largest = np.sort(others[np.argsort(-size, kind="stable")[:room]])
    keep = np.concatenate([problems, largest])
    return keep, len(params) - len(keep)


def wiring_table(params: pd.DataFrame, limit: int = 200):
    """One row per tensor, problems first (by severity, then bytes), as a pandas Styler.

    Verdicts are coloured by severity, numbers carry 3 significant digits, bytes are human
    readable, every name is escaped. Past `limit` rows, every flagged tensor stays and the
    largest others fill up to `limit`; the caption says how many rows were left out.
    """
    keep, left_out = _wiring_rows(params, limit)
    p = params.iloc[keep]
    n_opt = (_numeric(p["n_optimizers"]).fillna(0).to_numpy() if "n_optimizers" in p
             else np.ones(len(p)))
    opt_group = [("—" if pd.isna(o) else f"{int(o)}/{'?' if pd.isna(g) else int(g)}")
                 + (" (+more)" if n > 1 else "")
                 for o, g, n in zip(p["optimizer"], p["group"], n_opt)]
    steps = p["steps"]
    show = pd.DataFrame({
        "name": p["name"].astype(str),
        "verdicts": p["verdicts"].map(lambda vs: ", ".join(map(str, vs))),
        "requires_grad": p["requires_grad"].map(lambda b: "yes" if bool(b) else "no"),
        "optimizer/group": opt_group,
        "lr": p["lr"].map(fmt_number),
        "weight_decay": p["weight_decay"].map(fmt_number),
        "used": _fraction(p["used_steps"], steps),
        "changed": _fraction(p["changed_steps"], steps),
        "grad_norm": p["grad_norm"].map(fmt_number),
        "grad_total_norm": p["grad_total_norm"].map(fmt_number),
        "update_ratio": p["update_ratio"].map(fmt_number),
        "bytes": _numeric(p["bytes"]).fillna(0).astype(np.int64).map(human_bytes),
        "shape": p["shape"].map(fmt_shape),
    }, columns=list(WIRING_COLUMNS)).reset_index(drop=True).astype(object)
    if "stage" in p and (p["stage"].fillna("") != "").any():  # pipeline stages: which ranks
        show.insert(1, "stage", p["stage"].fillna("").astype(str).to_numpy())
    colours = [severity.COLORS[s] for s in row_severity(p).reset_index(drop=True)]
    caption = f"{len(params)} tensors"
    if left_out:
        caption = (f"{len(show)} of {len(params)} tensors shown: every flagged tensor, then the "
                   f"largest others. {left_out} rows left out; params.csv has them all.")
    return style_rows(show, colours, "verdicts", caption)


def style_rows(view: pd.DataFrame, colours: list[tuple[str, str]], column: str,
               caption: str):
    """The report's table look: escaped cells, one column coloured per row by severity,
    numbers right-aligned and kept with their units ('8.0 KiB' never wraps), the first two
    columns (names) left-aligned, a caption on top."""
    def colour(_column: pd.Series) -> list[str]:
        return [f"background-color:{bg};color:{fg}" for bg, fg in colours]

    names = [c for c in view.columns[:1]]  # a dotted name may wrap after its dots
    return (view.style.format(lambda v: keep_units(html.escape(str(v))))
            .format(lambda v: dotted_breaks(html.escape(str(v))), subset=names)
            .relabel_index([_header(c) for c in view.columns], axis="columns")
            .apply(colour, subset=[column])
            .hide(axis="index")
            .set_caption(caption)
            .set_table_styles([
                # Fit the output area (968 px in JupyterLab) by wrapping between words, after
                # a name's dots, and at a header's spaces: never inside a number or an
                # identifier (a number split over two lines reads as two numbers).
                {"selector": "", "props": "max-width:100%"},
                {"selector": "td, th", "props": "overflow-wrap:normal;word-break:normal"},
                {"selector": "td", "props": "text-align:right;padding:2px 4px"},
                {"selector": "td.col0, td.col1, th.col0, th.col1", "props": "text-align:left"},
                {"selector": "caption", "props": "caption-side:top;text-align:left"}]))


def _header(column: str) -> str:
    """A column's header as shown: its words, so that it wraps between them (the data keeps
    the column's name: `requires_grad` shows as "requires grad")."""
    return str(column).replace("_", " ").replace("/", " / ")


def module_rollup(params: pd.DataFrame, depth: int = 1) -> pd.DataFrame:
    """One row per module subtree `depth` levels deep: tensors, bytes, trainable tensors, the
    worst severity, and a count per verdict present; problems first."""
    labels = subtree_labels(params, depth)
    sizes = _numeric(params["bytes"]).fillna(0).astype(np.int64)
    level = row_severity(params)
    frame = pd.DataFrame({
        "module": labels.to_numpy(),
        "bytes": sizes.to_numpy(),
        "trainable": params["requires_grad"].astype(bool).to_numpy(),
        "rank": level.map(severity.rank).to_numpy(),
    })
    g = frame.groupby("module", sort=False)
    out = pd.DataFrame({
        "tensors": g.size(),
        "bytes": g["bytes"].sum(),
        "trainable": g["trainable"].sum().astype(np.int64),
        "problem_bytes": frame["bytes"].where(frame["rank"] > 0, 0).groupby(frame["module"],
                                                                            sort=False).sum(),
        "rank": g["rank"].max(),
    })
    exploded = pd.DataFrame({"module": labels.to_numpy(),
                             "verdict": params["verdicts"].map(tuple).to_numpy()})
    exploded = exploded.explode("verdict").dropna()
    per_verdict = pd.crosstab(exploded["module"], exploded["verdict"]) if len(exploded) else \
        pd.DataFrame(index=out.index)
    present = sorted(per_verdict.columns,
                     key=lambda v: (-severity.rank(severity_of(v)), list(VERDICTS).index(v)
                                    if v in VERDICTS else len(VERDICTS), v))
    out = out.join(per_verdict.reindex(columns=present)).fillna(0)
    out["worst"] = out["rank"].map(severity.named).astype(object)
    out = out.sort_values(["rank", "problem_bytes", "bytes"], ascending=False, kind="stable")
    columns = ["tensors", "bytes", "trainable", "worst"] + present
    out = out[columns].astype({c: np.int64 for c in columns if c != "worst"})
    return out.rename_axis("module").reset_index()


def module_table(params: pd.DataFrame, depth: int = 1):
    """`module_rollup` as the notebook shows it: the worst severity coloured, sizes in KiB /
    MiB as everywhere else (the rollup itself keeps bytes as numbers), problems first."""
    roll = module_rollup(params, depth)
    counts = [c for c in roll.columns if c not in ("module", "worst", "tensors", "bytes",
                                                    "trainable")]
    show = pd.DataFrame({
        "module": roll["module"].astype(str), "worst": roll["worst"].astype(str),
        "tensors": roll["tensors"], "bytes": roll["bytes"].map(human_bytes),
        "trainable": roll["trainable"], **{c: roll[c] for c in counts},
    }).astype(object)
    colours = [severity.COLORS[w] for w in roll["worst"]]
    caption = (f"{len(roll)} module subtree{'s' if len(roll) != 1 else ''} {depth} level"
               f"{'s' if depth != 1 else ''} deep, problems first; a count per verdict")
    return style_rows(show, colours, "worst", caption)
