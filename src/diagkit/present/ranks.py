"""The per-rank view of a distributed run: which ranks used which tensors on which steps, and
where their copies diverged. The differences come from `judge.rules_ranks.rank_differences`,
the same analysis the distributed verdicts use."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from ..core import severity
from ..core.format import fmt_number, spans
from ..judge.rules_ranks import rank_differences


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
        who = f"rank{'s' if len(ranks) > 1 else ''} {spans(ranks)}"
        when = (f"step{'s' if len(used) > 1 else ''} {spans(used)}" if used else "never")
        parts.append(f"{who}: {when}")
    return "; ".join(parts)


def rank_view(diag, limit: int = 50) -> str:
    """What differs between ranks in a distributed run (steps with a `rank` column).

    One row per tensor that was used on some ranks and not others on some step, or whose
    `checksum` differed between ranks after some step: which ranks used it on which steps, the
    first step after which its values diverged, and the largest relative checksum spread
    ((max - min) / max |checksum| over the ranks; inf when one rank's is NaN). Values that
    diverged come first (earliest, then widest), then the rank-dependent use. At most `limit`
    rows, then "and N more". A single-process run has nothing to compare: '' (the report
    folds an empty section into one line with the others).
    """
    steps = getattr(diag, "steps", diag)
    if steps is None or "rank" not in steps.columns:
        return ""
    has_checksum = "checksum" in steps.columns
    cols = ["step", "name", "rank", "used"] + (["checksum"] if has_checksum else [])
    s = steps[cols].copy()
    s["name"] = s["name"].astype(str)
    counts = _observed_per_rank(diag)
    ranks = sorted({int(r) for r in s["rank"].dropna().unique()} | set(counts))
    flagged = _flagged(s)
    out = [f'<div class="diagkit-ranks"><p>{_summary(ranks, _observed(counts, s), flagged)}'
           '</p>']
    if len(flagged):
        out += _table(s, flagged, limit)
    out.append("</div>")
    return "".join(out)


def _flagged(s: pd.DataFrame) -> pd.DataFrame:
    """Per tensor that differs between ranks on some step: whether it diverged or was used on
    some ranks only, the first step after which it diverged and its widest spread; in the
    order the view lists them (diverged first: earliest, then widest; then table order)."""
    position = pd.Series(np.arange(len(s)), index=s.index).groupby(s["name"], sort=False).min()
    per_step = rank_differences(s)
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
    return flagged.sort_values(["diverged", "first", "spread", "position"],
                               ascending=[False, True, False, True], kind="stable")


def _observed_per_rank(diag) -> dict[int, int]:
    """{rank: the steps it observed} where the run counted them per rank (a watch's
    `meta["ranks"]`), else {}. A whole-run watch keeps only some of its steps in the table
    (docs/whole-run.md, "The whole run"), and a rank that never stepped has no row at all."""
    ranks = (getattr(diag, "meta", None) or {}).get("ranks")
    if not isinstance(ranks, dict):
        return {}
    return {int(r): int(v["observed_steps"]) for r, v in ranks.items()
            if isinstance(v, dict) and "observed_steps" in v}


def _observed(counts: dict[int, int], s: pd.DataFrame) -> str:
    """'3 steps observed', or per rank where the ranks' counts differ."""
    kinds = set(counts.values()) if counts else {int(s["step"].nunique())}
    if len(kinds) == 1:
        n = kinds.pop()
        return f"{n} step{'s' if n != 1 else ''} observed"
    return "steps observed: " + ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))


def _summary(ranks: list[int], observed: str, flagged: pd.DataFrame) -> str:
    """The view's first line: how many ranks and steps were compared, and what differed."""
    n_div, n_mixed = int(flagged["diverged"].sum()), int(flagged["mixed"].sum())
    rank_text = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if ranks:
        rank_text += f" ({spans(ranks)})"
    return (f"{rank_text}, {observed}; "
            + (f"{len(flagged)} tensor{'s differ' if len(flagged) != 1 else ' differs'} "
               "between ranks"
               f" ({n_mixed} used on some ranks only, {n_div} with values that diverged)."
               if len(flagged) else "no tensor differs between ranks."))


def _table(s: pd.DataFrame, flagged: pd.DataFrame, limit: int) -> list[str]:
    """The HTML table of the first `limit` flagged tensors (names escaped: they come from user
    code), then how many were left out, so a long list stays readable yet complete in count."""
    esc = html.escape
    shown = flagged.iloc[:max(int(limit), 0)]
    rows_of = s[s["name"].isin(shown.index)].groupby("name", sort=False)
    warn, err = severity.COLORS["warning"], severity.COLORS["error"]
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
    out = [f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"]
    if len(flagged) > len(shown):
        out.append(f"<p>and {len(flagged) - len(shown)} more.</p>")
    return out
