"""The timeline of a whole-run watch (docs/whole-run.md, "The whole run"): which findings held
over which observed steps, with the wiring changes marked. Built from what the result holds
(`diag.meta["timeline"]`, one row per span, and `diag.meta["events"]`); nothing here measures.
"""

from __future__ import annotations

import html

import pandas as pd

from ..core import severity
from .figure import axes, label, no_data

_COLUMNS = ["code", "severity", "module", "since", "until", "ended"]


def timeline_table(diag) -> pd.DataFrame:
    """One row per span (`code, severity, module, since, until, ended`); empty for a run
    that was not watched whole."""
    return pd.DataFrame(diag.meta.get("timeline") or [], columns=_COLUMNS)


def ordered(spans: pd.DataFrame) -> pd.DataFrame:
    """The spans as the figure lists them, top to bottom: errors first, then warnings, then
    info (each by its first step), as every findings list reads; an info finding listed above
    an error hid what mattered most."""
    rank = spans["severity"].map(severity.rank).fillna(0)
    order = sorted(range(len(spans)), key=lambda i: (-rank.iloc[i], spans["since"].iloc[i], i))
    return spans.iloc[order].reset_index(drop=True)


def timeline_figure(spans: pd.DataFrame, events: list[dict] | None,
                    last_step: int | None = None):
    """One bar per span, from the step it was first seen to the last it held on (to the end
    of the run when it still held), coloured by severity, errors on top (`ordered`); a dashed
    line at each change, named in a legend beside the axes, where it covers no bar."""
    spans = ordered(spans)
    fig, ax = axes(height=max(2.2, 0.9 + 0.4 * len(spans)))
    title = "Findings over the run"
    if not len(spans):
        no_data(ax, "no finding held on any observed step" if events is not None else
                "not a whole-run watch (watch(..., steps=None))", title, "finding")
        _mark(ax, events or [])
        return fig
    end = max([int(spans["until"].max())] + ([last_step] if last_step is not None else []))
    for y, row in enumerate(spans.itertuples()):
        stop = row.until if pd.notna(row.ended) else end
        width = max(stop - row.since, 0) + 1
        ax.barh(y, width, left=row.since, height=0.6,
                color=severity.colors(row.severity)[0], edgecolor="0.3", lw=0.5)
    ax.set_yticks(range(len(spans)),
                  [label(f"{r.code}: {r.module or '(model)'}") for r in spans.itertuples()],
                  fontsize=8)
    ax.invert_yaxis()
    _mark(ax, events or [])
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def _mark(ax, events: list[dict]) -> None:
    for i, e in enumerate(events):
        ax.axvline(e["step"], color="0.35", ls="--", lw=0.8,
                   label="wiring change" if i == 0 else "_")
    if events:  # outside the axes: inside, it covered the bars at the end of the run
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)


def timeline_alt(spans: pd.DataFrame, events: list[dict] | None, most: int = 8) -> str:
    """The timeline in words, for its alt text: each span (errors first) and the changes."""
    if not len(spans):
        return "Timeline of the findings over the run: no finding held on any observed step."
    said = []
    for row in ordered(spans).head(most).itertuples():
        end = f"to step {row.until} (ended)" if pd.notna(row.ended) else "to the end"
        said.append(f"{row.severity} {row.code} in {row.module or 'the model'} from step "
                    f"{row.since} {end}")
    more = f"; and {len(spans) - most} more" if len(spans) > most else ""
    changes = (f" Wiring changes at step{'s' * (len(events) != 1)} "
               + ", ".join(str(int(e["step"])) for e in events[:most]) + "."
               if events else "")
    return "Timeline of the findings over the run: " + "; ".join(said) + more + "." + changes


def events_html(events: list[dict] | None, limit: int = 50) -> str:
    """The wiring changes, one line each (step, what); names are escaped. None (a run that
    was not watched whole, so no change was looked for): nothing."""
    if events is None:
        return ""
    if not events:
        return '<p class="diagkit-events">no wiring change was seen.</p>'
    items = "".join(f"<li>step {int(e['step'])}: {html.escape(str(e['what']))}</li>"
                    for e in events[:limit])
    more = f"<li>and {len(events) - limit} more</li>" if len(events) > limit else ""
    return f'<ul class="diagkit-events">{items}{more}</ul>'
