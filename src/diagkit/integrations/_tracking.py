"""What a callback hands the watch of its trackers (`report_to`; docs/integrations.md,
"Trackers"): the framework's own trackers as the default, each as the object the framework
opened where it has one (HF's TensorBoard writer, Lightning's loggers), and the step offset
that puts diagkit's value for an optimizer step at the framework's own step for it.

A framework's trackers are `(word, item)` pairs: `word` the `report_to` word ("tensorboard",
...), `item` what diagkit sends to (a tracker object, or the word itself when the tracker's
open run is found by the sink: `wandb.run`, `mlflow.active_run()`). Other trackers of the
framework (comet_ml, a CSV logger, ...) are left out quietly: diagkit has nothing for them.
"""

from __future__ import annotations

from ..run.trackers.choose import TRACKERS, unique, words
from ..run.trackers.context import Context


def chosen(report_to, framework: list[tuple[str, object]]) -> list:
    """What the watch sends to. `report_to` None: the framework's trackers. Otherwise the user's
    words, each one the framework also reports to taken as its object (so diagkit writes into
    the framework's TensorBoard file, not a second one); "all": the framework's trackers and
    every other tracker with a run open; "none": nothing."""
    if report_to is None:
        return unique([item for _, item in framework])
    asked = [report_to] if isinstance(report_to, str) else list(report_to)
    if "none" in asked:
        return []
    theirs = dict(framework)
    items = []
    for word in asked:
        if word == "all":
            items += [item for _, item in framework]
            items += [w for w in words("all") if w not in theirs]
        elif isinstance(word, str) and word in theirs:
            items.append(theirs[word])
        else:
            items.append(word)
    return unique(items)


def known(names) -> list[str]:
    """The words of `names` (a framework's tracker names) diagkit sends to, in order."""
    return [n for n in names if isinstance(n, str) and n in TRACKERS]


def context(items: list, *, framework: str, after: int, out, say, **objects) -> Context:
    """The watch's `tracking` context: `items` (from `chosen`) as its `report_to`. `after`:
    how far the framework's logged step of an optimizer step is from its global step before
    that step (HF: 1, it logs its global step after the step; Lightning: 0): the step offset
    of a whole-run watch, which numbers its steps on from the global step
    (`Attachment.start` adds the global step for a watch of `steps`, which counts from 0)."""
    return Context(out=out, step_offset=after, framework=framework,
                   objects={"report_to": items, **objects}, say=say)

