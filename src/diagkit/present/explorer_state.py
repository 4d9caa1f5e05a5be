"""The explorer's state: filters, ordering and default selection over the two result tables,
as a plain object testable without a kernel (widgets: `diagkit.present.explorer`; drawing the
plot, the status line and the HTML table: `diagkit.present.explorer_view`; the per-step data:
`diagkit.present.explorer_data`; the findings on top: `diagkit.present.explorer_findings`).
Presents only; never measures.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..core import severity
from ..judge.findings import sort_findings
from ..judge.verdicts import worst_verdict_severity
from . import explorer_choices, explorer_view
from .explorer_data import METRICS, StepData

MAX_OPTIONS = 500    # the tensor picker offers at most this many names
MAX_LINES = 40       # the plot draws at most this many tensors (the legend: explorer_view)


class ExplorerState:
    """Filters, ordering, selection and rendering over `params` and `steps`.

    Filters (all combine): `verdicts` (set of verdict names, empty = all), `module_prefix`
    (a module and its subtree, dotted: 'encoder.layers' matches 'encoder.layers.0' but not
    'encoder.layers_x'), `name_regex` (re.search on tensor names; an invalid pattern is
    reported in `message` and filters nothing). `metric` is one of `METRICS`; `selected` is the
    tensors plotted: set it to a list of names, or to None/[] for the default, the `top`
    problem tensors of the current filter that have data for the metric (then the ok ones
    with the most of it). `findings`: the diagnosis' findings, worst first (shown on top;
    `explorer_findings.pick` points the filters and the plot at one).

    Notes for the status line, each true until the next change of any field: `unpicked` (the
    last picked tensor was just taken off the pick), `picked_finding` (a finding was picked).
    """

    def __init__(self, params: pd.DataFrame, steps: pd.DataFrame, *, top: int = 6,
                 failure=None, findings=()):
        self.top = int(top)
        self.failure = failure
        self.findings = sort_findings(list(findings or ()))
        verdicts = [_as_verdicts(v) for v in params["verdicts"]] if "verdicts" in params else \
            [("ok",)] * len(params)
        rank = np.array([severity.rank(worst_verdict_severity(vs)) for vs in verdicts], dtype=int)
        # Problems first (most severe first), otherwise in the order the model gives them.
        order = np.lexsort((np.arange(len(params)), -rank))
        self.params = params.iloc[order].reset_index(drop=True)
        self.tensor_verdicts = [verdicts[i] for i in order]
        self.severity_ranks = rank[order]
        self.tensor_names = self.params["name"].astype(str).to_numpy(dtype=object)
        self._modules = (self.params["module"].fillna("").astype(str) if "module" in self.params
                         else pd.Series([""] * len(self.params)))
        self._verdict_mask: dict[str, np.ndarray] = {}
        for i, vs in enumerate(self.tensor_verdicts):
            for v in vs:
                self._verdict_mask.setdefault(v, np.zeros(len(self.params), dtype=bool))[i] = True
        self.steps = steps
        self.data = StepData(steps)   # step x (metric, name), built once on demand
        self._index = {n: i for i, n in enumerate(self.tensor_names)}
        self._filter_cache: tuple | None = None
        self._verdicts_filter: frozenset[str] = frozenset()
        self._module_prefix = ""
        self._name_regex = ""
        self._regex: re.Pattern | None = None
        self.regex_error: str | None = None
        self._metric = "grad_norm"
        self._explicit: list[str] | None = None
        self._log_scale = True
        self.unpicked = False
        self.picked_finding = None

    @classmethod
    def from_diagnosis(cls, diag, top: int = 6) -> "ExplorerState":
        return cls(diag.params, diag.steps, top=top, failure=getattr(diag, "failure", None),
                   findings=getattr(diag, "findings", ()))

    def _changed(self) -> None:
        """Any field set: the one-change notes of the status line are said no more (a note
        that stayed on after the next change contradicted what the explorer then showed)."""
        self.unpicked = False
        self.picked_finding = None

    # ------------------------------------------------------------------ fields
    @property
    def verdicts(self) -> frozenset[str]:
        return self._verdicts_filter

    @verdicts.setter
    def verdicts(self, value) -> None:
        self._changed()
        self._verdicts_filter = frozenset([value] if isinstance(value, str) else value or ())

    @property
    def module_prefix(self) -> str:
        return self._module_prefix

    @module_prefix.setter
    def module_prefix(self, value) -> None:
        self._changed()
        self._module_prefix = (value or "").strip()

    @property
    def name_regex(self) -> str:
        return self._name_regex

    @name_regex.setter
    def name_regex(self, value) -> None:
        self._changed()
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
        self._changed()
        self._metric = value

    @property
    def log_scale(self) -> bool:
        return self._log_scale

    @log_scale.setter
    def log_scale(self, value) -> None:
        self._changed()
        self._log_scale = bool(value)

    @property
    def selected(self) -> list[str]:
        """The tensors plotted: the explicit choice still passing the filters, else the default."""
        names = self.filtered()[1]["name"]
        if self._explicit:
            passing = set(names)
            kept = [n for n in self._explicit if n in passing]
            if kept:
                return kept
        return self.default_selection()

    @selected.setter
    def selected(self, value) -> None:
        picked = bool(self._explicit)
        self._changed()
        self._explicit = [str(n) for n in value] if value else None
        # the last pick taken off (ctrl-click): the plot goes back to the default, and says so
        self.unpicked = picked and not value

    def verdicts_of(self, name: str) -> tuple[str, ...]:
        """The verdicts of tensor `name` (() for a name the diagnosis does not hold)."""
        i = self._index.get(name)
        return () if i is None else self.tensor_verdicts[i]

    def module_of(self, name: str) -> str | None:
        """The module that holds tensor `name` (None for a name the diagnosis does not hold)."""
        i = self._index.get(name)
        return None if i is None else self._modules.iloc[i]

    # ------------------------------------------------------------------ choices
    def verdict_choices(self) -> list[tuple[str, str]]:
        """(label with count, verdict) for every verdict present, most severe first."""
        return explorer_choices.verdict_choices(self._verdict_mask)

    def module_choices(self) -> list[str]:
        """Every module subtree that holds a tensor, shortest first."""
        return explorer_choices.module_choices(self._modules)

    # ------------------------------------------------------------------ queries
    def filtered_params(self) -> pd.DataFrame:
        """Rows of params passing every filter, problems first."""
        return self.filtered()[1]

    def default_selection(self) -> list[str]:
        """Top problem tensors of the filter that have data for the metric, then the ok ones
        with the most of it: a default plot of tensors without data would be empty (the
        finetune demo's unused tensors have no grad_norm). Only when nothing in the filter has
        data are the problems chosen anyway, and the plot says what to do."""
        rows = self.filtered()[0]
        has_data = self._has_data()
        problems = [self.tensor_names[i] for i in rows if self.severity_ranks[i] > 0]
        drawable = [n for n in problems if has_data.get(n, False)][:self.top]
        ok = [i for i in rows
              if self.severity_ranks[i] == 0 and has_data.get(self.tensor_names[i], False)]
        if not drawable and not ok:
            return problems[:self.top]
        if len(drawable) >= self.top:
            return drawable
        if self._metric in self.params and ok:
            values = pd.to_numeric(self.params[self._metric].iloc[ok], errors="coerce")
            ok = list(values.sort_values(ascending=False, na_position="last", kind="stable").index)
        return drawable + [self.tensor_names[i] for i in ok[:self.top - len(drawable)]]

    def problems_without_data(self) -> list[str]:
        """Problem tensors of the filter with no value of the metric on any step, so that the
        status line can say why they are not plotted by default and how to see them."""
        has_data = self._has_data()
        return [self.tensor_names[i] for i in self.filtered()[0]
                if self.severity_ranks[i] > 0 and not has_data.get(self.tensor_names[i], False)]

    def series(self) -> pd.DataFrame:
        """The metric per step (rows) for each selected tensor (columns, in selection order)."""
        return self.data.series(self._metric, self.selected)

    def options(self) -> "explorer_choices.Options":
        """The tensor picker's choices: filtered names (capped), plus anything selected."""
        rows = self.filtered()[0]
        return explorer_choices.options(rows, self.selected, self._index, self._label,
                                        self.tensor_names, MAX_OPTIONS)

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

    # ------------------------------------------------------------------ rows and filters
    def _label(self, i: int) -> str:
        name = self.tensor_names[i]
        verdicts = ", ".join(self.tensor_verdicts[i])
        return f"{name}  [{verdicts}]" if self.severity_ranks[i] > 0 else name

    def module_mask(self) -> np.ndarray:
        """Which rows lie under the module filter (all, without one)."""
        prefix = self._module_prefix.rstrip(".")
        if not prefix:
            return np.ones(len(self.params), dtype=bool)
        mods = self._modules
        return ((mods == prefix) | mods.str.startswith(prefix + ".")).to_numpy(dtype=bool)

    def filtered(self) -> tuple[np.ndarray, pd.DataFrame]:
        """(row positions, params rows) that pass the three filters; cached until one changes,
        since the plot, the status line and the table each ask."""
        key = (self._verdicts_filter, self._module_prefix, self._name_regex)
        if self._filter_cache is not None and self._filter_cache[0] == key:
            return self._filter_cache[1]
        mask = self.module_mask()
        if self._verdicts_filter:
            hit = np.zeros(len(self.params), dtype=bool)
            for v in self._verdicts_filter:
                if v in self._verdict_mask:
                    hit |= self._verdict_mask[v]
            mask = mask & hit
        if self._regex is not None:
            search = self._regex.search
            mask = mask & np.fromiter((search(n) is not None for n in self.tensor_names),
                                      dtype=bool, count=len(self.tensor_names))
        rows = np.flatnonzero(mask)
        result = (rows, self.params.iloc[rows])
        self._filter_cache = (key, result)
        return result

    def _has_data(self) -> dict[str, bool]:
        return self.data.has_data(self._metric)


# ---------------------------------------------------------------------- helpers
def _as_verdicts(value) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (tuple, list, set, frozenset, np.ndarray)):
        return tuple(str(v) for v in value) or ("ok",)
    return ("ok",)

