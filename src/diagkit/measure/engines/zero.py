"""DeepSpeed ZeRO, watched through ZeRO's own groups of the model's tensors (docs/distributed.md,
"Engines: what is observed, what is refused").

ZeRO's optimizer (`DeepSpeedZeroOptimizer` for stages 1 and 2, `DeepSpeedZeroOptimizer_Stage3`)
wraps a torch optimizer whose groups hold ZeRO's flat fp32 partitions, never the model's
tensors (under stage 3 not even those, outside its own step). What keeps the model's tensors by
identity is ZeRO's own list per group (`bit16_groups`, `fp16_groups` under stage 3), group `i`
of it matching the torch optimizer's group `i` (lr, weight decay). And the model's values change
only once ZeRO's `step()` has copied the updated partitions back (an all-gather under stages 1
and 2), after the torch optimizer's own step has returned. So ZeRO is watched through a
`ZeroView`: a stand-in optimizer whose group `i` holds ZeRO's model tensors and reads every
other key from the torch group live (a scheduler's lr shows), and whose step hooks run around
ZeRO's `step()`: one step per `engine.step()` at an accumulation boundary, however many
sub-groups the torch optimizer steps.

Under ZeRO-3 a parameter outside forward is an empty placeholder; this rank's part of it is
`ds_tensor` (a flat slice of `ds_numel` elements, padded), the whole shape `ds_shape`. Values are
measured on that part and summed over the ranks (`measure.engines.shards`); gradients are read by the
parameter's own hook as autograd delivers them, the whole local gradient before ZeRO reduces it,
as under DDP. Duck-typed: deepspeed is never imported.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Mapping

import torch
from torch.utils.hooks import RemovableHandle

from ...core.errors import DiagkitError
from ...core.schema import ZERO3_PARTITION

ZERO_OPTIMIZERS = ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3")
PARTITION = ZERO3_PARTITION  # the params table's `placement` of a ZeRO-3 parameter


def is_zero(opt) -> bool:
    """Whether `opt` is DeepSpeed's ZeRO optimizer (stages 1 to 3)."""
    return type(opt).__name__ in ZERO_OPTIMIZERS


def is_partitioned(t) -> bool:
    """Whether `t` is a ZeRO-3 parameter: this rank holds only `ds_tensor`, a slice of it."""
    return isinstance(getattr(t, "ds_tensor", None), torch.Tensor) and hasattr(t, "ds_shape")


def partition(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a ZeRO-3 parameter, updated in place by ZeRO's step."""
    return t.ds_tensor


def whole_shape(t) -> tuple[int, ...]:
    """The shape the model declared: a ZeRO-3 placeholder's is (0,) between forwards."""
    return tuple(t.ds_shape) if is_partitioned(t) else tuple(t.shape)


def whole_numel(t) -> int:
    """The number of elements the model declared (a ZeRO-3 placeholder holds none)."""
    return int(t.ds_numel) if is_partitioned(t) else t.numel()


def partition_group(t):
    """The process group over which a ZeRO-3 parameter is partitioned (None: the world)."""
    group = getattr(t, "ds_process_group", None)
    return group if isinstance(group, torch.distributed.ProcessGroup) else None


def view_of(zero) -> "ZeroView":
    """The one view of a ZeRO optimizer: two watches of it share its step wrapper."""
    view = _VIEWS.get(zero)
    if view is None:
        view = _VIEWS[zero] = ZeroView(zero)
    return view


class LiveGroup(Mapping):
    """Group `i` as diagkit reads it: ZeRO's model tensors under "params", every other key the
    torch optimizer's group `i` as it is now."""

    def __init__(self, params: list, inner, i: int):
        self.params, self._inner, self._i = params, inner, i

    def _group(self) -> dict:
        return self._inner.param_groups[self._i]

    def __getitem__(self, key):
        return self.params if key == "params" else self._group()[key]

    def __iter__(self):
        yield "params"
        yield from (k for k in self._group() if k != "params")

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ZeroView:
    """A ZeRO optimizer seen as the torch optimizer over the model's tensors that it stands for:
    `param_groups` and the step hooks diagkit uses, nothing else."""

    def __init__(self, zero):
        self._zero = weakref.ref(zero)  # the cache of views is keyed weakly by it
        inner = getattr(zero, "optimizer", None)
        groups = _model_groups(zero, len(getattr(inner, "param_groups", ())))
        if groups is None:
            raise DiagkitError(
                f"diagkit cannot read this DeepSpeed {type(zero).__name__}'s groups of the "
                "model's tensors (bit16_groups or fp16_groups, one per torch optimizer group): "
                "a DeepSpeed version diagkit does not know")
        self.param_groups = [LiveGroup(g, inner, j) for j, g in enumerate(groups)]
        self._pre: OrderedDict = OrderedDict()
        self._post: OrderedDict = OrderedDict()
        self._original = None  # ZeRO's own step while the wrapper stands in for it

    zero = property(lambda self: self._zero(), doc="The ZeRO optimizer viewed.")
    class_name = property(lambda self: type(self.zero).__name__,
                          doc="What the user holds: ZeRO's optimizer (sources, fix texts).")

    @property
    def state(self) -> dict:
        """ZeRO keeps its optimizer state on its flat partitions: none is per model tensor."""
        return {}

    def register_step_pre_hook(self, hook) -> RemovableHandle:
        return self._add(self._pre, hook)

    def register_step_post_hook(self, hook) -> RemovableHandle:
        return self._add(self._post, hook)

    def _add(self, hooks: OrderedDict, hook) -> RemovableHandle:
        handle = _Handle(hooks, self)
        hooks[handle.id] = hook
        if self._original is None:
            self._wrap()
        return handle

    def _wrap(self) -> None:
        """Stand in for ZeRO's `step` on the instance (its class is left alone).

        The pre-hooks run once ZeRO's step has returned: only then is it known whether its
        loss scaler skipped the step (fp16 overflow, `zero.overflow`), and on a skipped step
        they do not run at all, as torch's GradScaler skips `optimizer.step()`: the observer
        marks the tensors `skipped` (docs/result.md, "Mixed precision"), and the step still counts.
        Nothing they read changes inside ZeRO's step: ZeRO has already taken the gradients it
        holds off the model's tensors (their `.grad` is None by then), and their
        `requires_grad` and lr are left alone."""
        zero, view = self.zero, self
        own = "step" in vars(zero)
        original = zero.step
        self._original = (original, own)

        def step(*args, **kwargs):
            out = original(*args, **kwargs)
            if not getattr(zero, "overflow", False):
                for hook in list(view._pre.values()):
                    hook(view, args, kwargs)
            for hook in list(view._post.values()):
                hook(view, args, kwargs)
            return out
        zero.step = step

    def settle(self) -> None:
        """With no hook left, ZeRO's own `step` is back, exactly as it was."""
        if self._pre or self._post or self._original is None:
            return
        original, own = self._original
        self._original = None
        if self.zero is None:
            return
        if own:
            self.zero.step = original
        else:
            vars(self.zero).pop("step", None)


def _model_groups(zero, n_inner: int) -> list[list] | None:
    """The model's tensors of each torch optimizer group, in its order. ZeRO-3 splits a
    group into sub-groups of at most `sub_group_size` elements (`fp16_groups`), each naming
    its group in `sub_group_to_group_id`; stages 1 and 2 keep one list per group. None: not
    the layout diagkit knows."""
    groups = getattr(zero, "bit16_groups", None) or getattr(zero, "fp16_groups", None)
    if not groups or not n_inner:
        return None
    owner = getattr(zero, "sub_group_to_group_id", None)
    if owner is None:
        return [list(g) for g in groups] if len(groups) == n_inner else None
    merged: list[list] = [[] for _ in range(n_inner)]
    for i, sub in enumerate(groups):
        j = owner.get(i)
        if j is None or not 0 <= j < n_inner:
            return None
        merged[j] += sub
    return merged


class _Handle(RemovableHandle):
    """A hook's handle whose removal gives ZeRO its own `step` back once no hook is left."""

    def __init__(self, hooks: OrderedDict, view: ZeroView):
        super().__init__(hooks)
        self._view = view

    def remove(self) -> None:
        super().remove()
        self._view.settle()


_VIEWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
