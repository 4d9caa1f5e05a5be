"""Every run option's default, meaning and check, in one place.

The library (`diagnose`, `run_target`), a target's `Setup`, the CLI's flags and the notebook's
parameters all take their defaults and their one-line errors from here, so they cannot drift
apart. (The notebook's parameters cell holds literals, so it repeats the defaults; a test keeps
it in step with `DEFAULTS`.)
"""

from __future__ import annotations

from .errors import DiagkitError

DELTA_MODES = ("exact", "sampled", "off")

DEFAULTS = {
    "steps": 5,        # training steps to observe
    "watch_steps": 20,  # optimizer steps `watch` observes in the user's own run
    "delta": "exact",  # how each step's change is measured (DELTA_MODES)
    "every": 1,        # observe every k-th step only
    "sample": 4096,    # elements sampled per large tensor (delta="sampled")
    "nproc": 1,        # processes of a torch.distributed job
    "timeout": 120,    # seconds before a run is ended (any nproc); watch: for the ranks
    "fail_on": "error",
    "meta": False,     # a dry run of the wiring on the meta device (one pass, no values)
    # delta="exact" on CUDA: the snapshots may take at most this fraction of the device's
    # free memory (torch.cuda.mem_get_info, when the observer attaches); past it the largest
    # tensors are fingerprinted instead (docs/cost.md, "Cost of observation").
    "memory_budget": 0.25,
}

HELP = {
    "steps": "training steps to observe",
    "delta": "how each step's change is measured: exact (a copy of every tensor), sampled "
             "(bounded memory: exact changed/unchanged, estimated norms) or off (no change "
             "norms); all give the same verdicts",
    "every": "observe only every K-th step (0, K, 2K, ...) of a long run",
    "sample": "elements per tensor",
    "nproc": "processes of a torch.distributed job (1: this process)",
    "timeout": "end a run (building the target and its steps) after this many seconds, and "
               "name the step and phase it was in (with --nproc: the stuck rank)",
    "meta": "build the target on the meta device and run one forward and backward: the "
            "wiring verdicts with no parameter memory; verdicts that need values are reported "
            "as not measured",
    "memory_budget": "delta=exact on CUDA: the snapshot buffers may take at most this fraction "
                     "(0 to 1) of the device's free memory; past it the largest tensors are "
                     "checked by fingerprint instead (exact changed, no change norm), and a "
                     "line is logged",
    "try_fix": "also apply each finding's fix to a fresh copy of the setup in memory, rerun "
               "the same steps and show the verdicts before -> after (exit code: the fixed "
               "run's)",
}


def positive_int(value, label: str, error: type[Exception] = DiagkitError, what: str = ""):
    """`value` if it is an int >= 1 (a bool is not), else `error` naming `label`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{label} must be a positive int (>= 1){what}, got {value!r}")
    return value


def positive_seconds(value, label: str, error: type[Exception] = DiagkitError):
    """`value` if it is a finite number of seconds > 0 (a bool is not), else `error`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise error(f"{label} must be a positive number of seconds (below 1e9: a deadline "
                    f"past that overflows the clock), got {value!r}")
    return value


def delta_mode(value, label: str = "delta", error: type[Exception] = DiagkitError) -> str:
    if value not in DELTA_MODES:
        raise error(f"{label} must be one of {', '.join(DELTA_MODES)}, got {value!r}")
    return value


def fraction(value, label: str = "memory_budget", error: type[Exception] = DiagkitError):
    """`value` if it is a number from 0 to 1 (a bool is not), else `error` naming `label`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise error(f"{label} must be a fraction of the free device memory, from 0 to 1, "
                    f"got {value!r}")
    return value


# Options with a check beyond their type, by name; the notebook's parameters of these names get
# the same check as the library's arguments and the CLI's flags.
CHECKS = {
    "steps": positive_int,
    "every": positive_int,
    "sample": lambda value, label, **kw: positive_int(value, label, what=" (elements per tensor)",
                                                      **kw),
    "nproc": positive_int,
    # an int of seconds the clock can hold (99999999999999 overflowed the deadline's thread)
    "timeout": lambda value, label, **kw: positive_seconds(positive_int(value, label, **kw),
                                                           label, **kw),
    "delta": delta_mode,
    "memory_budget": fraction,
}


def check_option(name: str, value, label: str | None = None,
                 error: type[Exception] = DiagkitError):
    """`value` of option `name` if it passes the option's check (see `CHECKS`)."""
    return CHECKS[name](value, label or name, error=error)


def meta_device(device, label: str = "device", error: type[Exception] = DiagkitError) -> bool:
    """True for `device="meta"` (a dry run of the wiring), False for None (a real run). Any
    other device is refused: a real run uses the model where it already is."""
    if device is None:
        return False
    if str(device) == "meta":
        return True
    raise error(f"{label} must be None (run on the model's own device) or 'meta' (a dry run of "
                f"the wiring), got {device!r}")


def check_meta_options(meta: bool, *, nproc=DEFAULTS["nproc"], checkpoint=None,
                       label=str) -> None:
    """What a meta dry run cannot combine with, refused in one line before any work: it runs
    in this process (no ranks), and a meta tensor holds no values to load a checkpoint into."""
    if not isinstance(meta, bool):
        raise DiagkitError(f"{label('meta')} must be True or False, got {meta!r}")
    if not meta:
        return
    if nproc != 1:
        raise DiagkitError(f"{label('meta')} is a dry run in this process: it cannot be "
                           f"combined with {label('nproc')} {nproc}")
    if checkpoint:
        raise DiagkitError(f"{label('meta')}: a meta tensor holds no values, so no checkpoint "
                           f"can be loaded into it ({label('checkpoint')} {checkpoint})")


def check_try_fix_options(try_fix: bool, *, meta=False, checkpoint=None, label=str) -> None:
    """What a fix preview cannot combine with, refused in one line before any work: it fixes
    a run's wiring, which a meta pass or a checkpoint loaded first does not change."""
    if not isinstance(try_fix, bool):
        raise DiagkitError(f"{label('try_fix')} must be True or False, got {try_fix!r}")
    if try_fix and meta:
        raise DiagkitError(f"{label('try_fix')} reruns real steps: it cannot be combined with "
                           f"{label('meta')}")
    if try_fix and checkpoint:
        raise DiagkitError(f"{label('try_fix')} builds fresh copies of the target: it cannot "
                           f"be combined with {label('checkpoint')} {checkpoint}")


def check_run_options(*, steps=None, delta=DEFAULTS["delta"], every=DEFAULTS["every"],
                      sample=DEFAULTS["sample"], label=str) -> None:
    """A clear one-line error before any work starts. `label(name)` words the option's name
    for its caller (the notebook says "notebook parameter 'steps'")."""
    values = {"steps": steps, "delta": delta, "every": every, "sample": sample}
    for name, value in values.items():
        if value is None and name == "steps":
            continue
        check_option(name, value, label(name))
