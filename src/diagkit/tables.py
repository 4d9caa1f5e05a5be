"""HTML and tables from the result tables, for the notebook and the offline report.

Pure functions of `Diagnosis` data (`params`, `steps`, findings, advice): nothing here measures.
Parameter and module names are user data, so every one of them is HTML-escaped; nothing emitted
holds a script or refers to anything outside the page.

The helpers in the first section (severity of a row, problems-first order, module subtrees,
left-truncated labels) are shared with `diagkit.plots`, so tables and figures rank alike.
"""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pandas as pd

from .findings import human_bytes
from .schema import SEVERITY_RANK
from .verdicts import VERDICTS

SEVERITY_ORDER = ("error", "warning", "info", "ok")
# severity -> (background, text colour); the report's CSS classes use the same backgrounds.
SEVERITY_COLORS = {
    "error": ("#fdd", "#b00020"),
    "warning": ("#ffe7b3", "#8a5300"),
    "info": ("#e3efff", "#1a4f8b"),
    "ok": ("#e8f5e9", "#2e7d32"),
}
UNKNOWN_SEVERITY = "warning"  # a verdict this version does not know (a newer save): surface it


# ------------------------------------------------------------------ shared helpers
def verdict_severity(verdict: str) -> str:
    """'error' / 'warning' / 'info' for a verdict, 'ok' for ok."""
    if verdict == "ok":
        return "ok"
    v = VERDICTS.get(verdict)
    return v.severity if v is not None else UNKNOWN_SEVERITY


def _rank(severity: str) -> int:
    return 0 if severity == "ok" else SEVERITY_RANK.get(severity, 0)


def worst_of(verdicts) -> str:
    """The worst severity among a tensor's verdicts ('ok' when none applies)."""
    return max((verdict_severity(v) for v in verdicts if v != "ok"), key=_rank, default="ok")


def row_severity(params: pd.DataFrame) -> pd.Series:
    """Worst severity per tensor row, aligned with params."""
    cache: dict[tuple, str] = {}
    out = []
    for vs in params["verdicts"]:
        key = tuple(vs)
        if key not in cache:
            cache[key] = worst_of(key)
        out.append(cache[key])
    return pd.Series(out, index=params.index, dtype=object)


def problems_first(params: pd.DataFrame) -> np.ndarray:
    """Row positions: flagged tensors by severity then bytes (largest first), then the others
    in model order."""
    rank = row_severity(params).map(_rank).to_numpy()
    size = pd.to_numeric(params["bytes"], errors="coerce").fillna(0).to_numpy()
    position = np.arange(len(params))
    # flagged: sort on (-rank, -bytes, position); ok rows: model order after them
    key_size = np.where(rank > 0, -size, 0)
    return np.lexsort((position, key_size, -rank))


def subtree_labels(params: pd.DataFrame, depth: int = 1) -> pd.Series:
    """Module subtree of each tensor, `depth` levels deep.

    When every model tensor's name starts with the DDP wrapper prefix `module.`, levels are
    counted after it (depth 1 of `module.encoder.layer.0` is `module.encoder`). Tensors of the
    root module are '(root)'; tensors held by an optimizer only are '(not in model)'.
    """
    depth = max(int(depth), 1)
    modules = params["module"].fillna("").astype(str)
    in_model = (params["in_model"].astype(bool) if "in_model" in params
                else pd.Series(True, index=params.index))
    names = params["name"].astype(str)[in_model]
    skip = 1 if len(names) and names.str.startswith("module.").all() else 0

    def label(module: str) -> str:
        parts = module.split(".") if module else []
        if len(parts) <= skip:
            return "(root)"
        return ".".join(parts[:skip + depth])

    labels = modules.map(label)
    return labels.where(in_model, "(not in model)").astype(object)


def truncate_left(text: str, width: int) -> str:
    """'…metamodel.model.mem_tokens': keep the end of a long name, where it differs."""
    text = str(text)
    return text if len(text) <= width else "…" + text[-(width - 1):]


def fmt_number(value) -> str:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "—"
    return "—" if math.isnan(x) else f"{x:.3g}"


def _numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce")


def severity_chip(severity: str, inner: str) -> str:
    bg, fg = SEVERITY_COLORS.get(severity, SEVERITY_COLORS["info"])
    return (f'<span class="diagkit-chip {severity}" style="display:inline-block;margin:2px;'
            f'padding:2px 8px;border-radius:4px;background:{bg};color:{fg}">{inner}</span>')


# ------------------------------------------------------------------ banner
def verdict_banner(diag) -> str:
    """How many tensors and bytes per verdict, worst first, coloured by severity; the totals;
    and, when the user's step raised, a red line with the failed step and its error."""
    esc = html.escape
    params = diag.params
    sizes = _numeric(params["bytes"]).fillna(0).astype(np.int64)
    counts: dict[str, list[int]] = {}
    for vs, size in zip(params["verdicts"], sizes):
        for v in vs:
            c = counts.setdefault(v, [0, 0])
            c[0] += 1
            c[1] += int(size)
    order = sorted(counts, key=lambda v: (-_rank(verdict_severity(v)), -counts[v][1], v))
    chips = "".join(
        severity_chip(verdict_severity(v),
                      f"<b>{esc(v)}</b> {n} tensor{'s' if n != 1 else ''}, {human_bytes(b)}")
        for v in order for n, b in [counts[v]])
    steps = (diag.meta or {}).get("steps_observed")
    if steps is None:
        steps = int(diag.steps["step"].nunique()) if len(diag.steps) else 0
    total = (f"{len(params)} tensors, {human_bytes(int(sizes.sum()))}, "
             f"{steps} step{'s' if steps != 1 else ''} observed")
    red = SEVERITY_COLORS["error"]
    lines = []
    if diag.failure is not None:
        k = int(diag.failure.step)
        kept = (f"The {k} step{'s' if k != 1 else ''} before it are kept and shown." if k
                else "No step completed.")
        lines.append(f"The training step failed at step {k}: "
                     f"{esc(str(diag.failure.error))}. {kept}")
    lines += [esc(f.message) for f in (diag.findings or []) if f.code == "check_failed"]
    alarms = "".join(
        f'<p class="diagkit-failure error" style="margin:4px 0;padding:4px 8px;'
        f'background:{red[0]};color:{red[1]};font-weight:bold">{line}</p>' for line in lines)
    return (f'<div class="diagkit-banner banner"><div>{chips}</div>'
            f'<p style="margin:4px 0">{total}</p>{alarms}</div>')


# ------------------------------------------------------------------ findings
_BACKTICKS = re.compile(r"`([^`]+)`")


def _prose(text: str) -> str:
    """Escape, then show `quoted names` as code."""
    return _BACKTICKS.sub(r"<code>\1</code>", html.escape(str(text)))


def findings_table(findings) -> str:
    """One row per finding, worst first: severity, verdict, where, tensors, bytes, message and
    the fix as code."""
    if not findings:
        return '<p class="diagkit-findings">No findings: every tensor is wired correctly.</p>'
    esc = html.escape
    ordered = sorted(enumerate(findings),
                     key=lambda p: (-_rank(p[1].severity), -int(p[1].bytes or 0), p[0]))
    rows = []
    for _, f in ordered:
        bg, fg = SEVERITY_COLORS.get(f.severity, SEVERITY_COLORS["info"])
        where = f.module or ("(whole model)" if f.count else "—")
        rows.append(
            f'<tr class="{esc(f.severity)}">'
            f'<td style="background:{bg};color:{fg};font-weight:bold;{_LEFT}">'
            f"{esc(f.severity)}</td><td style='{_LEFT}'>{esc(f.code)}</td>"
            f"<td style='{_LEFT};min-width:12em;overflow-wrap:anywhere'>{esc(where)}</td>"
            f"<td style='text-align:right;vertical-align:top'>{int(f.count or 0)}</td>"
            f"<td style='text-align:right;vertical-align:top;white-space:nowrap'>"
            f"{human_bytes(int(f.bytes or 0))}</td><td style='{_LEFT}'>{_prose(f.message)}</td>"
            f"<td style='{_LEFT}'><code style='white-space:pre-wrap'>{esc(f.fix)}</code></td></tr>")
    # Inline styles: the notebook's own CSS right-aligns table cells and would win over a class.
    head = "".join(f"<th style='{_LEFT}'>{h}</th>" for h in
                   ("severity", "verdict", "where", "tensors", "bytes", "finding", "fix"))
    return (f'<table class="diagkit-findings"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


_LEFT = "text-align:left;vertical-align:top"


# ------------------------------------------------------------------ every tensor
WIRING_COLUMNS = ("name", "verdicts", "requires_grad", "optimizer/group", "lr", "weight_decay",
                  "used", "changed", "grad_norm", "grad_total_norm", "update_ratio", "bytes",
                  "shape", "module_type")


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
        "shape": p["shape"].map(lambda s: "×".join(map(str, s)) if len(s) else "scalar"),
        "module_type": p["module_type"].fillna("").astype(str),
    }, columns=list(WIRING_COLUMNS)).reset_index(drop=True).astype(object)
    colours = [SEVERITY_COLORS[s] for s in row_severity(p).reset_index(drop=True)]
    caption = f"{len(params)} tensors"
    if left_out:
        caption = (f"{len(show)} of {len(params)} tensors shown: every flagged tensor, then the "
                   f"largest others. {left_out} rows left out; params.csv has them all.")
    return style_rows(show, colours, "verdicts", caption)


def style_rows(view: pd.DataFrame, colours: list[tuple[str, str]], column: str,
               caption: str):
    """The report's table look: escaped cells, one column coloured per row by severity,
    numbers right-aligned, the first two columns (names) left-aligned, a caption on top."""
    def colour(_column: pd.Series) -> list[str]:
        return [f"background-color:{bg};color:{fg}" for bg, fg in colours]

    return (view.style.format(escape="html")
            .apply(colour, subset=[column])
            .hide(axis="index")
            .set_caption(caption)
            .set_table_styles([
                {"selector": "td", "props": "text-align:right;padding:2px 6px"},
                {"selector": "td.col0, td.col1", "props": "text-align:left"},
                {"selector": "caption", "props": "caption-side:top;text-align:left"}]))


# ------------------------------------------------------------------ per module
def module_rollup(params: pd.DataFrame, depth: int = 1) -> pd.DataFrame:
    """One row per module subtree `depth` levels deep: tensors, bytes, trainable tensors, the
    worst severity, and a count per verdict present; problems first."""
    labels = subtree_labels(params, depth)
    sizes = _numeric(params["bytes"]).fillna(0).astype(np.int64)
    severity = row_severity(params)
    frame = pd.DataFrame({
        "module": labels.to_numpy(),
        "bytes": sizes.to_numpy(),
        "trainable": params["requires_grad"].astype(bool).to_numpy(),
        "rank": severity.map(_rank).to_numpy(),
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
                     key=lambda v: (-_rank(verdict_severity(v)), list(VERDICTS).index(v)
                                    if v in VERDICTS else len(VERDICTS), v))
    out = out.join(per_verdict.reindex(columns=present)).fillna(0)
    out["worst"] = out["rank"].map(
        {_rank(s): s for s in SEVERITY_ORDER}).fillna("ok").astype(object)
    out = out.sort_values(["rank", "problem_bytes", "bytes"], ascending=False, kind="stable")
    columns = ["tensors", "bytes", "trainable", "worst"] + present
    out = out[columns].astype({c: np.int64 for c in columns if c != "worst"})
    return out.rename_axis("module").reset_index()


# ------------------------------------------------------------------ advice
def _names_list(names, most: int = 8) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(f"<code>{html.escape(n)}</code>" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def advice_html(advice: dict) -> str:
    """The find_unused_parameters and static_graph advice (see findings.build_advice), with its
    evidence and recommendation."""
    esc = html.escape
    advice = advice or {}
    fup = advice.get("find_unused_parameters") or {}
    sg = advice.get("static_graph") or {}
    if not fup and not sg:
        return '<div class="diagkit-advice"><p>No DDP advice (nothing was observed).</p></div>'
    parts = []
    if fup:
        need = bool(fup.get("value"))
        bg, fg = SEVERITY_COLORS["warning" if need else "ok"]
        parts.append(
            f'<p><span style="background:{bg};color:{fg};padding:2px 6px;border-radius:4px">'
            + ("DDP needs <b>find_unused_parameters=True</b></span> as the model is now: "
               if need else "<b>find_unused_parameters=False</b></span> is enough: ")
            + f"{esc(str(fup.get('evidence', '')))}.</p>")
        if fup.get("unused"):
            parts.append(f"<p>Never received a gradient "
                         f"({human_bytes(int(fup.get('unused_bytes') or 0))}): "
                         f"{_names_list(fup['unused'])}.</p>")
        if fup.get("intermittent"):
            parts.append(f"<p>Received gradients on some steps only: "
                         f"{_names_list(fup['intermittent'])}.</p>")
        if fup.get("recommendation"):
            parts.append(f"<p><b>Recommendation:</b> {esc(str(fup['recommendation']))}.</p>")
        if need and "after_fix" in fup:
            parts.append(f"<p>After that fix: <code>find_unused_parameters="
                         f"{bool(fup['after_fix'])}</code>.</p>")
    if sg:
        possible = bool(sg.get("value"))
        parts.append(f"<p><b>static_graph=True {'is possible' if possible else 'is not possible'}"
                     f"</b>: {esc(str(sg.get('evidence', '')))}.</p>")
    return f'<div class="diagkit-advice">{"".join(parts)}</div>'


# ------------------------------------------------------------------ per rank (distributed)
def _spans(values) -> str:
    """'0–2, 5' for 0, 1, 2, 5."""
    values = sorted(set(int(v) for v in values))
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}–{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _use_by_rank(rows: pd.DataFrame) -> str:
    """Which ranks used one tensor on which steps, ranks with the same steps together:
    'rank 1: steps 0–2; rank 0: never'."""
    used_steps = {int(r): tuple(sorted(int(s) for s in g.loc[g["used"].astype(bool), "step"]))
                  for r, g in rows.groupby("rank", sort=True)}
    by_steps: dict[tuple, list[int]] = {}
    for r, used in used_steps.items():
        by_steps.setdefault(used, []).append(r)
    parts = []
    for used, ranks in sorted(by_steps.items(), key=lambda kv: (not kv[0], kv[1])):
        who = f"rank{'s' if len(ranks) > 1 else ''} {_spans(ranks)}"
        when = (f"step{'s' if len(used) > 1 else ''} {_spans(used)}" if used else "never")
        parts.append(f"{who}: {when}")
    return "; ".join(parts)


def rank_view(diag, limit: int = 50) -> str:
    """What differs between ranks in a distributed run (steps with a `rank` column).

    One row per tensor that was used on some ranks and not others on some step, or whose
    `checksum` differed between ranks after some step: which ranks used it on which steps, the
    first step after which its values diverged, and the largest relative checksum spread
    ((max - min) / max |checksum| over the ranks; inf when one rank's is NaN). Values that
    diverged come first (earliest, then widest), then the rank-dependent use. At most `limit`
    rows, then "and N more". A single-process run has nothing to compare: a short note.
    """
    esc = html.escape
    steps = getattr(diag, "steps", diag)
    if steps is None or "rank" not in steps.columns:
        return '<p class="diagkit-ranks">single process: no per-rank view.</p>'
    has_checksum = "checksum" in steps.columns
    cols = ["step", "name", "rank", "used"] + (["checksum"] if has_checksum else [])
    s = steps[cols].copy()
    s["name"] = s["name"].astype(str)
    ranks = sorted(int(r) for r in s["rank"].dropna().unique())
    n_steps = int(s["step"].nunique())
    position = pd.Series(np.arange(len(s)), index=s.index).groupby(s["name"], sort=False).min()

    keys = [s["name"], s["step"]]
    mixed_use = s["used"].astype(bool).groupby(keys).nunique() > 1
    if has_checksum:
        cs = _numeric(s["checksum"])
        hi, lo = cs.groupby(keys).max(), cs.groupby(keys).min()
        diverged = cs.groupby(keys).nunique(dropna=False) > 1
        scale = np.maximum(hi.abs(), lo.abs())
        spread = ((hi - lo) / scale.where(scale > 0)).fillna(0.0)
        spread = spread.where(~(cs.isna().groupby(keys).any() & diverged), np.inf)
        spread = spread.where(diverged, 0.0)
    else:
        diverged = pd.Series(False, index=mixed_use.index)
        spread = pd.Series(0.0, index=mixed_use.index)

    per_step = pd.DataFrame({"mixed": mixed_use, "diverged": diverged, "spread": spread})
    per_step = per_step[per_step["mixed"] | per_step["diverged"]].reset_index()
    per_step.columns = ["name", "step", "mixed", "diverged", "spread"]
    div_step = per_step["step"].where(per_step["diverged"])
    g = per_step.assign(div_step=div_step).groupby("name", sort=False)
    flagged = pd.DataFrame({
        "diverged": g["diverged"].any(),
        "mixed": g["mixed"].any(),
        "first": g["div_step"].min(),
        "spread": g["spread"].max(),
    })
    flagged["position"] = position.reindex(flagged.index).to_numpy()
    flagged = flagged.sort_values(["diverged", "first", "spread", "position"],
                                  ascending=[False, True, False, True], kind="stable")

    n_div, n_mixed = int(flagged["diverged"].sum()), int(flagged["mixed"].sum())
    rank_text = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if ranks:
        rank_text += f" ({_spans(ranks)})"
    summary = (f"{rank_text}, {n_steps} step{'s' if n_steps != 1 else ''} observed; "
               + (f"{len(flagged)} tensor{'s differ' if len(flagged) != 1 else ' differs'} "
                  "between ranks"
                  f" ({n_mixed} used on some ranks only, {n_div} with values that diverged)."
                  if len(flagged) else "no tensor differs between ranks."))
    out = [f'<div class="diagkit-ranks"><p>{summary}</p>']
    if len(flagged):
        shown = flagged.iloc[:max(int(limit), 0)]
        rows_of = s[s["name"].isin(shown.index)].groupby("name", sort=False)
        warn, err = SEVERITY_COLORS["warning"], SEVERITY_COLORS["error"]
        body = []
        for name, f in shown.iterrows():
            bg, fg = err if f["diverged"] else warn
            first = f"after step {int(f['first'])}" if f["diverged"] else "—"
            body.append(
                f'<tr class="{"error" if f["diverged"] else "warning"}">'
                f'<td style="background:{bg};color:{fg}"><code>{esc(name)}</code></td>'
                f"<td>{esc(_use_by_rank(rows_of.get_group(name)))}</td>"
                f"<td>{first}</td>"
                f"<td style='text-align:right'>"
                f"{fmt_number(f['spread']) if f['diverged'] else '—'}</td></tr>")
        head = "".join(f"<th>{h}</th>" for h in ("tensor", "used on", "values diverged",
                                                 "max relative spread"))
        out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
                   "</table>")
        if len(flagged) > len(shown):
            out.append(f"<p>and {len(flagged) - len(shown)} more.</p>")
    out.append("</div>")
    return "".join(out)


# ------------------------------------------------------------------ checkpoint
def checkpoint_html(checkpoint: dict | None, limit: int = 30) -> str:
    """What loading the checkpoint did, and its dead bytes (diag.checkpoint)."""
    if not checkpoint:
        return "<p>No checkpoint was loaded.</p>"
    esc = html.escape
    load = checkpoint.get("load", {})
    parts = [f"<p>{esc(checkpoint.get('summary', ''))}.</p>"]
    audit = checkpoint.get("audit") or {}
    kinds = audit.get("by_kind", {})
    if kinds:
        rows = "".join(
            f"<tr><td>{esc(kind)}</td><td>{v['tensors']}</td><td>{human_bytes(v['bytes'])}</td>"
            f"<td>{v['share']:.1%}</td><td>{esc(', '.join(v['names'][:6]))}"
            f"{' …' if len(v['names']) > 6 else ''}</td></tr>"
            for kind, v in sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]))
        parts.append(
            f"<p>Of the checkpoint's {human_bytes(audit.get('checkpoint_bytes', 0))}:</p>"
            "<table><tr><th>tensors this run</th><th>count</th><th>bytes</th><th>share</th>"
            f"<th>e.g.</th></tr>{rows}</table>")
    problems = ([(n, "missing from the file") for n in load.get("missing", [])]
                + [(n, "in the file, not in the model") for n in load.get("unexpected", [])]
                + [(m["name"], f"shape {tuple(m['file'])} in the file, {tuple(m['model'])} "
                    "in the model") for m in load.get("mismatched", [])])
    if problems:
        rows = "".join(f"<tr><td>{esc(n)}</td><td>{esc(what)}</td></tr>"
                       for n, what in problems[:limit])
        more = f"<p>and {len(problems) - limit} more.</p>" if len(problems) > limit else ""
        parts.append(f"<table><tr><th>tensor</th><th>not loaded because</th></tr>{rows}</table>"
                     + more)
    return "".join(parts)
