"""The explorer's state: filters, ordering and default selection over the two result tables,
as a plain object testable without a kernel (widgets: `diagkit.present.explorer`; drawing the
plot, the status line and the HTML table: `diagkit.present.explorer_view`). Presents only;
never measures.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core import severity
from ..judge.verdicts import severity_of, worst_verdict_severity
from ..measure.aggregate import fold_ranks
from . import explorer_view

METRICS: dict[str, str] = {
    "grad_norm": "L2 norm of the step's own gradient",
    "grad_total_norm": "L2 norm of the .grad the optimizer sees",
    "delta_norm": "L2 norm of the step's change",
    "update_ratio": "change / norm of the value before",
}
MAX_OPTIONS = 500    # the tensor picker offers at most this many names
MAX_LINES = 40       # the plot draws at most this many tensors (the legend: explorer_view)


class Options(NamedTuple):
    """What the tensor picker offers: (label, name) pairs, how many matched, and a note."""

    choices: list[tuple[str, str]]
    total: int
    note: str


class ExplorerState:
    """Filters, ordering, selection and rendering over `params` and `steps`.

    Filters (all combine): `verdicts` (set of verdict names, empty = all), `module_prefix`
    (a module and its subtree, dotted: 'encoder.layers' matches 'encoder.layers.0' but not
    'encoder.layers_x'), `name_regex` (re.search on tensor names; an invalid pattern is
    reported in `message` and filters nothing). `metric` is one of `METRICS`; `selected` is the
    tensors plotted: set it to a list of names, or to None/[] for the default, the `top`
    problem tensors of the current filter that have data for the metric (then the ok ones
    with the most of it).
    """

    def __init__(self, params: pd.DataFrame, steps: pd.DataFrame, *, top: int = 6,
                 failure=None):
        self.top = int(top)
        self.failure = failure
        verdicts = [_as_verdicts(v) for v in params["verdicts"]] if "verdicts" in params else \
            [("ok",)] * len(params)
        rank = np.array([severity.rank(worst_verdict_severity(vs)) for vs in verdicts], dtype=int)
        # Problems first (most severe first), otherwise in the order the model gives them.
        order = np.lexsort((np.arange(len(params)), -rank))
        self.params = params.iloc[order].reset_index(drop=True)
        self._verdicts = [verdicts[i] for i in order]
        self._rank = rank[order]
        self._names = self.params["name"].astype(str).to_numpy(dtype=object)
        self._modules = (self.params["module"].fillna("").astype(str) if "module" in self.params
                         else pd.Series([""] * len(self.params)))
        self._verdict_mask: dict[str, np.ndarray] = {}
        for i, vs in enumerate(self._verdicts):
            for v in vs:
                self._verdict_mask.setdefault(v, np.zeros(len(self.params), dtype=bool))[i] = True
        self.steps = steps
        self._wide: pd.DataFrame | None = None   # step x (metric, name), built once on demand
        self._filter_cache: tuple | None = None
        self._verdicts_filter: frozenset[str] = frozenset()
        self._module_prefix = ""
        self._name_regex = ""
        self._regex: re.Pattern | None = None
        self.regex_error: str | None = None
        self._metric = "grad_norm"
        self._explicit: list[str] | None = None
        self.unpicked = False  # the last picked tensor was just taken off the pick
        self.log_scale = True

    @classmethod
    def from_diagnosis(cls, diag, top: int = 6) -> "ExplorerState":
        return cls(diag.params, diag.steps, top=top, failure=getattr(diag, "failure", None))

    # ------------------------------------------------------------------ fields
    @property
    def verdicts(self) -> frozenset[str]:
        return self._verdicts_filter

    @verdicts.setter
    def verdicts(self, value) -> None:
        self._verdicts_filter = frozenset([value] if isinstance(value, str) else value or ())

    @property
    def module_prefix(self) -> str:
        return self._module_prefix

    @module_prefix.setter
    def module_prefix(self, value) -> None:
        self._module_prefix = (value or "").strip()

    @property
    def name_regex(self) -> str:
        return self._name_regex

    @name_regex.setter
    def name_regex(self, value) -> None:
        self._name_regex = value or ""
        self._regex, self.regex_error = None, None
        if self._name_regex:
            try:
                self._regex = re.compile(self._name_regex)
            except re.error as exc:
                self.regex_error = (f"invalid regex {self._name_regex!r}: {exc}; "
                                    f"the name filter is ignored until it is fixed")

    @property
    def metric(self) -> str:
        return self._metric

    @metric.setter
    def metric(self, value: str) -> None:
        if value not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {value!r}")
        self._metric = value

    @property
    def selected(self) -> list[str]:
        """The tensors plotted: the explicit choice still passing the filters, else the default."""
        names = self._filtered()[1]["name"]
        if self._explicit:
            passing = set(names)
            kept = [n for n in self._explicit if n in passing]
            if kept:
                return kept
        return self.default_selection()

    @selected.setter
    def selected(self, value) -> None:
        picked = bool(self._explicit)
        self._explicit = [str(n) for n in value] if value else None
        # the last pick taken off (ctrl-click): the plot goes back to the default, and says so
        self.unpicked = picked and not value

    # ------------------------------------------------------------------ choices
    def verdict_choices(self) -> list[tuple[str, str]]:
        """(label with count, verdict) for every verdict present, most severe first."""
        present = sorted(self._verdict_mask, key=lambda v: (
            v == "ok", -severity.rank(severity_of(v)), v))
        return [(f"{v} ({int(self._verdict_mask[v].sum()):,})", v) for v in present]

    def module_choices(self) -> list[str]:
        """Every module subtree that holds a tensor, shortest first."""
        found = set()
        for module in pd.unique(self._modules):
            parts = module.split(".") if module else []
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return sorted(found, key=lambda m: (m.count("."), m))

    # ------------------------------------------------------------------ queries
    def filtered_params(self) -> pd.DataFrame:
        """Rows of params passing every filter, problems first."""
        return self._filtered()[1]

    def default_selection(self) -> list[str]:
        """Top problem tensors of the filter that have data for the metric, then the ok ones
        with the most of it: a default plot of tensors without data would be empty (the
        finetune demo's unused tensors have no grad_norm). Only when nothing in the filter has
        data are the problems chosen anyway, and the plot says what to do."""
        rows = self._filtered()[0]
        has_data = self._has_data()
        problems = [self._names[i] for i in rows if self._rank[i] > 0]
        drawable = [n for n in problems if has_data.get(n, False)][:self.top]
        ok = [i for i in rows if self._rank[i] == 0 and has_data.get(self._names[i], False)]
        if not drawable and not ok:
            return problems[:self.top]
        if len(drawable) >= self.top:
            return drawable
        if self._metric in self.params and ok:
            values = pd.to_numeric(self.params[self._metric].iloc[ok], errors="coerce")
            ok = list(values.sort_values(ascending=False, na_position="last", kind="stable").index)
        return drawable + [self._names[i] for i in ok[:self.top - len(drawable)]]

    def problems_without_data(self) -> list[str]:
        """Problem tensors of the filter with no value of the metric on any step, so that the
        status line can say why they are not plotted by default and how to see them."""
        has_data = self._has_data()
        return [self._names[i] for i in self._filtered()[0]
                if self._rank[i] > 0 and not has_data.get(self._names[i], False)]

    def series(self) -> pd.DataFrame:
        """The metric per step (rows) for each selected tensor (columns, in selection order)."""
        selected = self.selected
        wide = self._wide_table()
        if self._metric in wide.columns.get_level_values(0):
            table = wide[self._metric]
        else:
            table = pd.DataFrame(index=wide.index)
        out = table.reindex(columns=selected)
        out.columns.name = "name"
        return out

    def options(self) -> Options:
        """The tensor picker's choices: filtered names (capped), plus anything selected."""
        rows = self._filtered()[0]
        shown = list(rows[:MAX_OPTIONS])
        names = {self._names[i] for i in shown}
        index = {n: i for i, n in enumerate(self._names)}
        shown += [index[n] for n in self.selected if n not in names and n in index]
        choices = [(self._label(i), self._names[i]) for i in shown]
        total = len(rows)
        if total == 0:
            note = "no tensor matches the filters"
        elif total > MAX_OPTIONS:
            note = (f"the picker lists the first {MAX_OPTIONS:,} of {total:,} matching tensors "
                    f"(problems first); narrow the filters to reach the others")
        else:
            note = ""
        return Options(choices, total, note)

    @property
    def message(self) -> str:
        """One plain-text status line: what matches, and anything the user should know
        (`explorer_view.status_text`)."""
        return explorer_view.status_text(self, max_lines=MAX_LINES)

    # ------------------------------------------------------------------ rendering
    def figure(self) -> Figure:
        """A line per selected tensor: the metric over the steps (`explorer_view.figure`)."""
        return explorer_view.figure(self, max_lines=MAX_LINES, ylabel=METRICS[self._metric])

    def table_html(self, limit: int = 50) -> str:
        """The filtered rows as an HTML table, names escaped (`explorer_view.table_html`)."""
        return explorer_view.table_html(self, limit)

    # ------------------------------------------------------------------ internals
    def _label(self, i: int) -> str:
        name = self._names[i]
        return f"{name}  [{', '.join(self._verdicts[i])}]" if self._rank[i] > 0 else name

    def _module_mask(self) -> np.ndarray:
        prefix = self._module_prefix.rstrip(".")
        if not prefix:
            return np.ones(len(self.params), dtype=bool)
        mods = self._modules
        return ((mods == prefix) | mods.str.startswith(prefix + ".")).to_numpy(dtype=bool)

    def _filtered(self) -> tuple[np.ndarray, pd.DataFrame]:
        key = (self._verdicts_filter, self._module_prefix, self._name_regex)
        if self._filter_cache is not None and self._filter_cache[0] == key:
            return self._filter_cache[1]
        mask = self._module_mask()
        if self._verdicts_filter:
            hit = np.zeros(len(self.params), dtype=bool)
            for v in self._verdicts_filter:
                if v in self._verdict_mask:
                    hit |= self._verdict_mask[v]
            mask = mask & hit
        if self._regex is not None:
            search = self._regex.search
            mask = mask & np.fromiter((search(n) is not None for n in self._names),
                                      dtype=bool, count=len(self._names))
        rows = np.flatnonzero(mask)
        result = (rows, self.params.iloc[rows])
        self._filter_cache = (key, result)
        return result

    def _wide_table(self) -> pd.DataFrame:
        """step x (metric, name), built from the steps table once."""
        if self._wide is None:
            s = self.steps
            if not len(s) or "step" not in s or "name" not in s:
                self._wide = pd.DataFrame(
                    index=pd.Index([], name="step"),
                    columns=pd.MultiIndex.from_arrays([[], []], names=[None, "name"]))
            else:
                s = fold_ranks(s)  # one row per (step, tensor)
                cols = {m: (pd.to_numeric(s[m], errors="coerce").to_numpy(dtype=float)
                            if m in s else np.full(len(s), np.nan)) for m in METRICS}
                index = pd.MultiIndex.from_arrays(
                    [s["step"].to_numpy(), s["name"].astype(str).to_numpy(dtype=object)],
                    names=["step", "name"])
                self._wide = pd.DataFrame(cols, index=index).unstack("name").sort_index()
        return self._wide

    def _has_data(self) -> dict[str, bool]:
        wide = self._wide_table()
        if self._metric not in wide.columns.get_level_values(0):
            return {}
        return wide[self._metric].notna().any().to_dict()


# ---------------------------------------------------------------------- helpers
def _as_verdicts(value) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (tuple, list, set, frozenset, np.ndarray)):
        return tuple(str(v) for v in value) or ("ok",)
    return ("ok",)

