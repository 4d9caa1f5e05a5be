"""What to diagnose: a `Setup`, and `load_target` that builds one from "module:function".

Everything a user hands us is checked here, up front, so that a wrong type or a typo in a key
fails with a sentence naming it instead of a traceback from inside the training step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ...core.errors import DiagkitError, TargetError
from ...core.options import positive_int
from ...measure.origin.provenance import record_optimizer_sources, sources_for
from ...measure.engines.unwrap import unwrap_optimizers
from ...measure.engines.zero import ZeroView
from . import deadline
from .spec import no_file, no_module, split_spec

_KEYS = ("model", "optimizer", "optimizers", "batch_fn", "loss_fn", "train_step", "steps",
         "zero_grad_set_to_none", "lr_scheduler")


@dataclasses.dataclass
class Setup:
    """A training setup to diagnose: a model, its optimizers, and one way to run a step.

    Give either `batch_fn` + `loss_fn` (diagkit runs the standard loop, `diagkit.run.diagnose.loop`) or
    `train_step(step_index)` (your own loop, observed unchanged).
    """

    model: torch.nn.Module
    optimizers: list = dataclasses.field(default_factory=list)
    optimizer: dataclasses.InitVar[Any] = None  # alias: one optimizer (or a list)
    batch_fn: Callable[[], Any] | None = None
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    train_step: Callable[[int], Any] | None = None
    steps: int | None = None
    zero_grad_set_to_none: bool = True
    lr_scheduler: Any = None
    # Where each optimizer group was built (`measure.origin.provenance`), when diagkit saw it built.
    optimizer_sources: list = dataclasses.field(default_factory=list, repr=False)
    # The DeepSpeed engine given as `model` (its module and ZeRO's optimizer are observed).
    engine: Any = dataclasses.field(default=None, repr=False)

    def __post_init__(self, optimizer=None):
        if optimizer is not None:
            if self.optimizers:
                raise TargetError("give 'optimizer' or 'optimizers', not both")
            self.optimizers = optimizer
        if type(self.model).__name__ == "DeepSpeedEngine":
            self._see_through_engine()
        self.optimizers = _as_optimizer_list(self.optimizers)
        self.validate()

    def _see_through_engine(self) -> None:
        """A DeepSpeed engine as `model`: its module is observed under ZeRO's optimizer (the
        engine's own when none is given; `measure.engines.zero`). It runs its own backward and step,
        so only a `train_step` can drive it."""
        if self.train_step is None:
            raise TargetError("a DeepSpeed engine runs its own backward and step: give "
                              "'train_step' (loss = engine(batch); engine.backward(loss); "
                              "engine.step()), not 'batch_fn' + 'loss_fn'")
        self.engine = engine = self.model
        try:
            self.optimizers = unwrap_optimizers(self.optimizers or None, engine)
        except DiagkitError as exc:
            raise TargetError(str(exc)) from None
        self.model = engine.module

    def validate(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise TargetError(f"'model' must be a torch.nn.Module, got {_tname(self.model)}")
        has_loop = self.batch_fn is not None or self.loss_fn is not None
        if self.train_step is not None and has_loop:
            raise TargetError("give either 'train_step' or 'batch_fn' + 'loss_fn', not both")
        if self.train_step is None:
            if self.batch_fn is None or self.loss_fn is None:
                missing = [k for k in ("batch_fn", "loss_fn") if getattr(self, k) is None]
                raise TargetError(
                    f"missing {' and '.join(repr(k) for k in missing)}: give 'batch_fn' + "
                    "'loss_fn' (standard loop) or 'train_step' (your own loop)")
        for key in ("batch_fn", "loss_fn", "train_step"):
            value = getattr(self, key)
            if value is not None and not callable(value):
                raise TargetError(f"'{key}' must be callable, got {_tname(value)}")
        if self.steps is not None:
            positive_int(self.steps, "'steps'", error=TargetError)
        if not isinstance(self.zero_grad_set_to_none, bool):
            raise TargetError("'zero_grad_set_to_none' must be True or False, "
                              f"got {self.zero_grad_set_to_none!r}")
        if self.lr_scheduler is not None and not callable(getattr(self.lr_scheduler, "step", None)):
            raise TargetError(f"'lr_scheduler' must have a .step() method, "
                              f"got {_tname(self.lr_scheduler)}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], origin: str = "the target") -> "Setup":
        """Build from the mapping a target function returns, naming any bad key."""
        if isinstance(mapping, Setup):
            return mapping
        if not isinstance(mapping, Mapping):
            raise TargetError(f"{origin} must return a mapping or a diagkit.Setup, "
                              f"got {_tname(mapping)}")
        unknown = [k for k in mapping if k not in _KEYS]
        if unknown:
            raise TargetError(f"{origin} returned unknown key(s) {', '.join(map(repr, unknown))}; "
                              f"expected some of: {', '.join(_KEYS)}")
        if "model" not in mapping:
            raise TargetError(f"{origin} returned no 'model'")
        if "optimizer" in mapping and "optimizers" in mapping:
            raise TargetError(f"{origin} returned both 'optimizer' and 'optimizers': give one")
        engine = type(mapping["model"]).__name__ == "DeepSpeedEngine"
        if "optimizer" not in mapping and "optimizers" not in mapping and not engine:
            raise TargetError(f"{origin} returned no 'optimizer' (or 'optimizers')")
        kwargs = dict(mapping)
        kwargs["optimizers"] = (kwargs.pop("optimizer") if "optimizer" in kwargs
                                else kwargs.pop("optimizers", []))
        return cls(**kwargs)


def _as_optimizer_list(value) -> list:
    if value is None:
        raise TargetError("no optimizer given: pass one torch.optim.Optimizer or a list of them")
    items = [value] if isinstance(value, (torch.optim.Optimizer, ZeroView)) else value
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise TargetError(f"'optimizer' must be a torch.optim.Optimizer or a list of them, "
                          f"got {_tname(value)}")
    items = list(items)
    for i, opt in enumerate(items):
        if not isinstance(opt, (torch.optim.Optimizer, ZeroView)):
            raise TargetError(f"optimizer {i} must be a torch.optim.Optimizer, got {_tname(opt)}")
    if not items:
        raise TargetError("the list of optimizers is empty")
    return items


def _tname(value) -> str:
    return type(value).__name__


def load_target(spec: str, **kwargs) -> Setup:
    """Import `"package.module:function"` or `"path/to/file.py:function"` and call it.

    A file target's folder is importable while the file is imported and its function runs, as
    under `python path/to/file.py`, so `import helpers` finds the helpers.py next to it.
    Meanwhile every optimizer group built is recorded with the user's line that built it
    (`Setup.optimizer_sources`; the patches come off when the build ends, however it ends).
    """
    deadline.mark("importing")  # under --timeout, the run's clock starts here
    try:
        with target_folder_importable(spec), record_optimizer_sources() as recorder:
            fn = resolve_target(spec)
            deadline.mark("building")
            check_kwargs(fn, spec, kwargs)
            result = _build(fn, spec, kwargs)
        setup = Setup.from_mapping(result, origin=f"target {spec!r}")
        setup.optimizer_sources = sources_for(recorder, setup.optimizers)
        return setup
    except BaseException:
        deadline.finish()  # no run follows: nothing left to time out
        raise


def _build(fn: Callable, spec: str, kwargs: dict):
    """Call the target's function; its failure, its sys.exit or a timeout is one line."""
    try:
        return fn(**kwargs)
    except TargetError:
        raise
    except deadline.TimedOut as exc:
        raise TargetError(str(exc)) from None
    except SystemExit as exc:  # not diagkit's exit code: the target's bug, named as one
        raise TargetError(f"target {spec!r} called sys.exit({exc.code!r}) while building the "
                          "setup") from None
    except Exception as exc:  # the user's builder failed: say so in one line, keep the cause
        raise TargetError(f"target {spec!r} raised while building the setup: "
                          f"{type(exc).__name__}: {exc}{_hint(exc)}") from exc


def _hint(exc: Exception) -> str:
    """What to do, where a target's failure has a known cause on diagkit's side: DeepSpeed
    without a process group looks for MPI to start one (`mpi4py`)."""
    if (isinstance(exc, ImportError) and getattr(exc, "name", None) == "mpi4py"
            and "deepspeed" in sys.modules):
        return (" (DeepSpeed looks for MPI when no process group exists: run the target "
                "under one, with --nproc N)")
    return ""


@contextlib.contextmanager
def target_folder_importable(spec):
    """Put a file target's folder first on sys.path for the duration, as `python file.py`
    would, so its sibling modules import; then take it off again, so that one target's folder
    does not shadow modules for the rest of the process. (Modules imported meanwhile stay
    imported.) Not a file target, or the folder already on the path: nothing changes."""
    where = spec.split(":")[0] if isinstance(spec, str) and spec.count(":") == 1 else ""
    folder = str(Path(where).resolve().parent) if where.endswith(".py") else None
    if folder is None or not Path(folder).is_dir() or folder in sys.path:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def resolve_target(spec: str) -> Callable:
    """The target's function, imported but not called (the CLI checks a target this way
    before it launches ranks, so a typo fails in one line here, not in N processes)."""
    where, name = split_spec(spec)
    with target_folder_importable(spec):
        module = _import_file(where) if where.endswith(".py") else _import_module(where)
    fn = getattr(module, name, None)
    if fn is None:
        raise TargetError(f"target {spec!r}: {where} has no function {name!r}")
    if not callable(fn):
        raise TargetError(f"target {spec!r}: {name!r} is a {_tname(fn)}, not a function")
    return fn


def _import_module(dotted: str):
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and (dotted == exc.name or dotted.startswith(exc.name + ".")):
            raise no_module(dotted) from None
        raise TargetError(f"importing {dotted!r} failed: {exc}") from exc
    except Exception as exc:  # user code raised while importing: name it, one line
        raise TargetError(f"importing {dotted!r} failed: {type(exc).__name__}: {exc}") from exc
    except (SystemExit, deadline.TimedOut) as exc:
        raise TargetError(_import_exit(dotted, exc)) from None


def _import_file(path: str):
    file = Path(path)
    if not file.is_file():
        raise no_file(path)
    mod_name = f"diagkit_target_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise TargetError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    except (SystemExit, deadline.TimedOut) as exc:
        sys.modules.pop(mod_name, None)
        raise TargetError(_import_exit(path, exc)) from None
    return module


def _import_exit(where: str, exc: BaseException) -> str:
    """A target module that calls sys.exit (or hangs) at import: its exit code is not
    diagkit's."""
    if isinstance(exc, SystemExit):
        return f"importing {where} failed: it called sys.exit({exc.code!r}) at import"
    return str(exc)


def check_kwargs(fn: Callable, spec: str, kwargs: dict) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        params = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        accepted = ", ".join(p.name for p in params) or "no arguments"
        raise TargetError(f"target {spec!r}: {exc}; it accepts: {accepted}") from None
