"""`report_to`: which trackers a watch sends to, checked when the watch is built and opened as it
starts (docs/integrations.md, "Trackers"). The words are the ecosystem's (HF's `report_to`):
"wandb", "tensorboard", "mlflow", "trackio", a list of them, "all" (each one installed and with a
run open) or "none". A tracker object (a TensorBoard `SummaryWriter`) may stand in a list."""

from __future__ import annotations

import importlib
import importlib.util

from ...core.errors import DiagkitError

# report_to word -> (the module of diagkit that sends to it, the package it needs)
TRACKERS = {"wandb": ("to_wandb", "wandb"), "tensorboard": ("to_tensorboard", "tensorboard"),
            "mlflow": ("to_mlflow", "mlflow"), "trackio": ("to_trackio", "trackio")}
WORDS = (*TRACKERS, "all", "none")
INSTALL = "pip install 'diagkit[trackers]'"


def check_report_to(value) -> None:
    """A `DiagkitError` (one line) for a `report_to` diagkit cannot read: not a word it knows,
    not a str, list or tuple. Whether a tracker is installed or has a run open is judged as the
    watch starts, never an error (training must not die of its tracker)."""
    if value is None:
        return
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise DiagkitError(f"report_to must be a tracker's name, a list of them, 'all' or "
                           f"'none'; got {type(value).__name__}")
    for item in items:
        if isinstance(item, str) and item not in WORDS:
            raise DiagkitError(f"report_to: unknown tracker {item!r}; diagkit sends to "
                               f"{', '.join(map(repr, WORDS))}")
        if not isinstance(item, str) and _module_for(item) is None:
            raise DiagkitError(f"report_to: diagkit cannot send to a {type(item).__name__}; "
                               f"name a tracker ({', '.join(map(repr, TRACKERS))})")


def words(value) -> list:
    """The trackers `value` names, "all" and "none" resolved: words and objects, in order,
    without repeats. "all": every tracker installed whose run is open."""
    items = [] if value is None else [value] if isinstance(value, str) else list(value)
    if "none" in items:
        return []
    chosen = []
    for item in items:
        if item == "all":
            chosen += [w for w in TRACKERS if installed(w) and _module(w).active()]
        else:
            chosen.append(item)
    return unique(chosen)


def unique(items: list) -> list:
    """`items` without repeats, in order: a word once, an object once (by identity: a tracker
    object need not compare equal to itself)."""
    kept = []
    for item in items:
        if not any(item is k or (isinstance(item, str) and item == k) for k in kept):
            kept.append(item)
    return kept


def open_sinks(value, context) -> list:
    """One open `Sink` per tracker `value` names; one `context.say` line for each that cannot
    be sent to (not installed, no open run), which is left out."""
    sinks = []
    for item in words(value):
        word = item if isinstance(item, str) else _module_for(item)
        if not installed(word):
            context.say(f"diagkit: report_to {word!r}: {TRACKERS[word][1]} is not installed "
                        f"({INSTALL}); not sending to it")
            continue
        try:
            sink = _module(word).open(context, None if isinstance(item, str) else item)
        except Exception as exc:  # the tracker's failure: one line, the watch goes on
            context.say(f"diagkit: report_to {word!r}: could not open it: "
                        f"{type(exc).__name__}: {exc}; not sending to it")
            continue
        if sink is not None:
            sinks.append(sink)
    return sinks


def installed(word: str) -> bool:
    """Whether the package a tracker needs can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(TRACKERS[word][1]) is not None
    except (ImportError, ValueError):
        return False


def _module(word: str):
    return importlib.import_module(f"{__package__}.{TRACKERS[word][0]}")


def _module_for(obj) -> str | None:
    """The tracker a tracker object belongs to (each module's `owns(obj)`), or None. Only
    modules whose package is already imported are asked: an object of theirs exists only then."""
    import sys
    for word, (_, package) in TRACKERS.items():
        if package in sys.modules and _module(word).owns(obj):
            return word
    return None
