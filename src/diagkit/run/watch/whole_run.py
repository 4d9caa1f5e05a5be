"""A watch over the whole run (`watch(..., steps=None, every=k)`): observe one optimizer step in
`every`, see each wiring change at the step it happens, judge window by window, and say each
new problem once, as it appears (docs/whole-run.md, "The whole run").

How a run is cut:
- a **burst**: at the start and right after each wiring change (`measure.clock.wiring`), the next
  `BURST` steps are observed one after another and judged together as one window, so a
  change's consequence is judged and announced `BURST` steps after it;
- then **windows** of `WINDOW` observed steps, one step in `every`, each judged as it closes;
- each window's findings join the timeline (`judge.timeline`): a finding that goes on is one
  span, a window without it ends it;
- what is kept of the steps is bounded (`measure.clock.kept_steps`).

Announcing (a new warning or error): one line through `logging.getLogger("diagkit")`, the
user's `on_finding(finding)`, and `should_stop` when it reaches `halt_on`. With `out`, the
diagnosis so far is saved atomically after each change's burst and at most every
`SAVE_SECONDS` otherwise, so a run killed outright keeps everything up to the last save.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref

from ...core import severity
from ...core.result import Diagnosis
from ...judge.rules_change import zero_gradient_untold
from ...judge.timeline import Timeline, as_finding, onsets, when
from ...judge.verdicts import VERDICTS
from ...measure.model.inventory import take_inventory
from ...measure.clock.kept_steps import KeptSteps
from ...measure.clock.new_optimizers import NewOptimizers, shared
from ...measure.engines.unwrap import compiled
from ...measure.clock.wiring import Wiring
from ...present.text import finding_line
from ..diagnose.pipeline import Observation, judge_observation
from .observations import published
from .whole_run_names import Names, rename_history
from .whole_run_ranks import RankJoin

BURST = 4           # steps observed one after another at the start and after each change
WINDOW = 8          # observed steps judged together otherwise
SAVE_SECONDS = 120  # the longest a run goes unsaved (with out)

log = logging.getLogger("diagkit")


class WholeRun:
    """The whole-run state of one `Watch`: the wiring, the window being observed, the
    timeline, the kept steps. `plan` is the `RunClock`'s: called at the end of every step."""

    def __init__(self, watch, model, optimizers, *, every: int, on_finding=None,
                 halt_on: str | None = None):
        self.watch, self.model, self.optimizers, self.every = watch, model, optimizers, every
        self.on_finding, self.halt_on = on_finding, halt_on
        # A compiled model: no global module hook (dynamo guards on them: a recompile)
        self.wiring = Wiring(model, optimizers,
                             registration_hooks=not compiled(model, watch.entry))
        self.events: list[dict] = []
        self.dropped: list[dict] = []          # observed steps not judged, and why
        self.timeline = Timeline()
        self.kept = KeptSteps()
        self.rows: dict[str, dict] = {}        # every tensor seen, by name (the latest row)
        self.names = Names()                   # tensors that left the model, named apart
        # (code, module) -> the observed steps of the window whose figures a finding holds
        self.figures: dict[tuple[str, str], tuple[int, int]] = {}
        self.verdicts: dict[str, set] = {}     # every verdict each tensor had, by name
        # zero_gradient: tensors some window could not tell, and those one could (or that
        # got a non-zero gradient): the run says it could not tell the first less the second
        self.untold: set[str] = set()
        self.told: set[str] = set()
        self.should_stop = False
        self.inventory = watch.inventory
        self.observer = watch.new_observer(self.inventory)
        self.burst_left, self.around = BURST, True
        self.windows = 0
        channel = watch.channel
        self.ranks = RankJoin(channel) if channel is not None and channel.rank == 0 else None
        self.judging = channel is None or channel.rank == 0  # the other ranks only publish
        self._saved_at = time.monotonic()
        self.retired = weakref.WeakSet()  # optimizers a newer one replaced
        self.births = (NewOptimizers(optimizers, lambda: set(map(id, self.inventory.tensors)),
                                     self.adopt) if optimizers else None)
        if self.births is not None:
            self.births.attach()

    # ---------------------------------------------------------------- the clock's side
    def plan(self, index: int, recorded: bool):
        """Step `index` ended (`recorded`: it was observed): look for a wiring change, close
        the window when it is due; the observer of step `index + 1`, or None."""
        if recorded:
            if self.ranks is not None:
                self.ranks.recorded(index, self.wiring.digest())
            published(self.watch, index)
            if self.around:
                self.burst_left -= 1
        changes = self.wiring.changes(index)
        if changes:
            self._changed(changes, straddled=index if recorded else None)
        elif recorded and self._window_full():
            self._close_window()
        if self.burst_left > 0 or (index + 1) % self.every == 0:
            return self.observer
        return None

    def adopt(self, new) -> None:
        """An optimizer over the model's tensors that the watch was not given steps for the
        first time (`measure.clock.new_optimizers`): from now on it is watched. It replaces those
        it shares a tensor with (a loop rebuilding its optimizer), unless one of them was
        itself replaced and stepped again (both live: it joins them). An event, like any
        wiring change: what came before is judged, a burst is observed."""
        clock = self.watch.clock
        index = clock.count
        changes = self.wiring.changes(index)  # what the loop changed first (an unfreeze)
        back = new in self.retired
        replaced = [] if back else [i for i, o in enumerate(self.optimizers) if shared(o, new)]
        old = [self.optimizers[i] for i in replaced]
        if clock.swap(new, replaced):
            self.dropped.append({"step": index, "why": "a new optimizer stepped during it"})
        for opt in old:  # followed again if it steps again
            self.retired.add(opt)
            self.births.known.discard(opt)
        self.wiring.take_groups()
        held = sum(len(g["params"]) for g in new.param_groups)
        what = (f"a new {type(new).__name__} ({len(new.param_groups)} group"
                f"{'s' * (len(new.param_groups) != 1)}, {held} tensors) "
                + (f"replaced optimizer {replaced[0]} ({type(old[0]).__name__})" if replaced
                   else "joined the watched optimizers") + " at its first step()")
        self._changed(changes + [{"step": index, "kind": "optimizer", "names": [],
                                  "what": what}], straddled=None)

    def _window_full(self) -> bool:
        return (self.burst_left <= 0 if self.around
                else len(self.observer.records) >= WINDOW)

    def _changed(self, changes: list[dict], straddled: int | None) -> None:
        """A wiring change: judge what came before, take the new wiring, observe a burst.
        The observed step the change happened in (`straddled`) is dropped: it was measured
        with the old wiring's facts (who holds what), so judging it would be confidently
        wrong about the very tensors that changed."""
        for event in changes:
            log.info("diagkit: step %d: wiring changed: %s", event["step"], event["what"])
        self.events += [{k: v for k, v in e.items() if k != "names"} | {"names": e["names"][:8]}
                        for e in changes]
        if straddled is not None:
            self.dropped.append({"step": straddled, "why": "the wiring changed during it"})
        old, before = self.observer, self.inventory
        self._close_window(replace=False, drop=straddled, read_base=False)
        step = changes[0]["step"]
        former = self.names.former(before, self.model, step)
        self.inventory = take_inventory(self.model, self.optimizers, former=former)
        rename_history(self, self.names.renames(before, self.inventory, former))
        if self.watch.channel is not None:  # rank 0 joins the ranks' rows (pipeline stages)
            self.watch.channel.publish_rows(self.inventory.rows)
        self.observer = self.watch.new_observer(self.inventory)
        self.observer.continue_window(old)  # what stays frozen: not read again
        self.burst_left, self.around = BURST, True

    def _close_window(self, replace: bool = True, drop: int | None = None,
                      read_base: bool = True) -> None:
        """Judge the window's steps (but `drop`) into the timeline, keep some of them,
        announce what is new; then a fresh observer for the next window (the same wiring).
        `read_base`: read the frozen base first, its change marked on the window's last step
        (not at a wiring change: a tensor unfrozen in the step it happened in would read as
        changed while frozen; docs/cost.md, "When the frozen base is read")."""
        observer, around = self.observer, self.around
        if read_base:
            observer.close_window()
        steps = observer.steps_table() if self.judging else ()
        if drop is not None and len(steps):
            steps = steps[steps["step"] != drop].reset_index(drop=True)
        if len(steps):
            rows = observer.rows
            if self.ranks is not None:
                rows = self.watch.channel.rows(rows)
                self.ranks.staged = any(row["stage"] for row in rows)
                steps = self._joined(steps)
            self._judge_window(rows, steps, around)
        self.around = False
        if replace:
            self.observer = self.watch.new_observer(self.inventory)
            self.observer.continue_window(observer)  # from the read just taken
        if self.judging and (around or time.monotonic() - self._saved_at > SAVE_SECONDS):
            self.save()

    def _judge_window(self, rows: list[dict], steps, around: bool) -> None:
        self.windows += 1
        judged = self.judge(rows, steps)
        params = judged.params
        for name, verdicts in zip(params["name"], params["verdicts"]):
            self.verdicts.setdefault(name, set()).update(v for v in verdicts if v != "ok")
        untold = set(zero_gradient_untold(params, steps))
        self.untold |= untold
        self.told |= set(steps.loc[steps["used"].astype(bool), "name"]) - untold
        self.rows.update((row["name"], row) for row in rows)
        first, last = int(steps["step"].min()), int(steps["step"].max())
        new = ({(f.code, f.module) for f in judged.findings if f.code in VERDICTS}
               - self.timeline.open_keys())
        starts = (onsets(steps, new, lambda one: self.judge(rows, one).findings)
                  if new and first != last else {})
        for span in self.timeline.advance(judged.findings, first, last, starts, self.events):
            self._announce(span)
        if self.watch.trackers is not None:  # report_to: the series, one point a step
            self.watch.trackers.judged(steps["step"], judged.findings)
        self.figures.update(((f.code, f.module), (first, last)) for f in judged.findings)
        self.kept.add(steps, around_change=around)

    def _joined(self, steps):
        """Every rank's rows of the window; a rank wired differently is announced once."""
        known = self.ranks.mismatch
        joined = self.ranks.join(steps)
        if known is None and self.ranks.mismatch is not None:
            self._say(self.ranks.mismatch, self.ranks.mismatch.since)
        return joined

    def judge(self, rows: list[dict], steps) -> Diagnosis:
        """One window's verdicts; its findings show where the groups were built, as the
        final diagnosis's do (the announced line and the timeline name the same lever)."""
        sources = getattr(self.watch, "sources", None)
        names = getattr(self.watch, "names", None)  # the fixes say the user's own names
        return judge_observation(Observation(rows, steps, None, {
            "optimizers": len(self.optimizers),
            **({"optimizer_sources": sources} if sources else {}),
            **({"names": names} if names else {})}))

    # ---------------------------------------------------------------- announcing
    def _announce(self, span) -> None:
        self._say(as_finding(span), span.since)

    def _say(self, f, since: int) -> None:
        """A new finding: one log line (`present.text.finding_line`), `halt_on`, the user's
        `on_finding` (warnings and errors only)."""
        if severity.rank(f.severity) < severity.rank("warning"):
            return
        # One short line (severity, verdict, where, step, the first line of the fix): a
        # notebook wraps a long one mid-number. The whole text stays in the diagnosis.
        log.log(logging.ERROR if f.severity == "error" else logging.WARNING, "%s",
                finding_line(f, since))
        if self.watch.trackers is not None:  # report_to: the tracker's alert, once
            self.watch.trackers.announced(f, since)
        if self.halt_on is not None and severity.rank(f.severity) >= severity.rank(self.halt_on):
            self.should_stop = True
        if self.on_finding is not None:
            try:
                self.on_finding(f)
            except Exception as exc:  # never into the user's loop: said once, then not called
                self.on_finding = None
                self.watch.say(f"diagkit: on_finding raised {type(exc).__name__}: {exc}; it "
                               f"is not called again")

    # ---------------------------------------------------------------- the result
    def finish(self) -> None:
        """The watch ends: the window in progress is judged too."""
        self._close_window(replace=False)
        self.unhook()

    def unhook(self) -> None:
        """The hooks the whole run set itself off (the wiring check's, and the global ones that
        find new optimizers): at its end, and when diagkit fails and the run goes on unwatched."""
        self.wiring.release()
        if self.births is not None:
            self.births.detach()

    def spans(self) -> list:
        """The timeline's findings. A finding's figures (`1.83 → 2.41 over 8 steps`) are those
        of the last window it held in: where that window began after the finding did, its
        tag says which steps they are of, so they never read as the figures of its first
        step (the line logged then had none)."""
        out = []
        for span in self.timeline.spans:
            f = as_finding(span)
            first, last = self.figures.get(span.key, (span.since, span.until))
            if first > span.since:
                f = dataclasses.replace(f, message=f"{span.finding.message} [{when(span)}; "
                                                   f"its figures: observed steps {first}-{last}]")
            out.append(f)
        return out

    def observation(self, failure, meta: dict) -> Observation:
        """What to judge the result from: every tensor seen, the kept steps."""
        return Observation(list(self.rows.values()) or self.inventory.rows, self.kept.table(),
                           failure, meta)

    def save(self) -> None:
        """The diagnosis so far, saved to `out` as the run goes (rank 0)."""
        self._saved_at = time.monotonic()
        self.watch.save_running()

