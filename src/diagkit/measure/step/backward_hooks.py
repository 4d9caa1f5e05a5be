"""`BackwardHooks`: the strategy that observes a step's gradients with a hook on each tensor.

A hook fires as autograd accumulates into the tensor (what `used` means, and what DDP
watches); the backward's gradients are measured when it ends, before anything (clipping,
unscaling) rewrites .grad in place. It works in any loop and under any process group, which is
why every tensor no hookless share reads (`gradients.OptimizerShare`) is observed this way.
A backward traced by compiled autograd cannot be observed through hooks: its step is dropped.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch
from torch.utils.hooks import unserializable_hook

from ..batched.kernels import max_abs
from ..engines.shards import is_sharded, local
from .fresh_norms import measure_fresh
from .skips import reset_probe
from .state import StepState

COMPILED_BACKWARD = ("its backward ran under compiled autograd, where diagkit's gradient hooks "
                     "are traced away: used and the gradients are not observed (docs/watch.md, "
                     "\"torch.compile\")")


class BackwardHooks:
    """A hook on each of the tensors `ks`, frozen ones too (a tensor unfrozen mid-run must be
    observed). `observer` supplies the step in progress (`active`, `state`)."""

    def __init__(self, observer, ks: list[int], keep_own: bool = False):
        self.obs = observer
        self.ks = ks
        # An engine frees .grad inside the backward (DeepSpeed ZeRO with overlap_comm copies
        # each into its buckets): the gradient is kept from the hooks instead (`hook_for`).
        self.keep_own = keep_own
        self.by_tensor: dict[int, object] = {}  # k -> its hook's handle
        # A sharded tensor's .grad when its hook last fired: (weak reference, version).
        self.last_sharded: dict[int, tuple] = {}
        # Set where dynamo traced a hook (compiled autograd): the step is not observed.
        self.blind = False

    def attach(self, handles: list, ks=None) -> None:
        """Hook `ks` (default: all of ours), appending the handles to `handles`."""
        for k in self.ks if ks is None else ks:
            t = self.obs.tensors[k]
            was = t.requires_grad
            try:
                if not was:
                    t.requires_grad_(True)
                handles.append(handle := (
                    t.register_post_accumulate_grad_hook(self._sharded_hook(k))
                    if is_sharded(t) else t.register_hook(unserializable_hook(
                        self.hook_for(k) if self.keep_own else self._hook(k)))))
                self.by_tensor[k] = handle
            except RuntimeError:  # not a leaf we can hook: observed through values only
                pass
            finally:
                if not was:
                    t.requires_grad_(False)

    def unhook(self, ks) -> None:
        """Remove the hooks of `ks` (an `EarnedShare` reads them from .grad instead)."""
        for k in ks:
            handle = self.by_tensor.pop(k, None)
            if handle is not None:
                handle.remove()

    def at_optimizer_step(self, i: int, st: StepState) -> None:
        """The gradients were measured as each backward ended. A carried-over .grad counts only
        if it is still in the .grad this optimizer steps on: a `zero_grad` after the backward
        that landed on it (a GAN's G pass through D, discarded by D's next `zero_grad`) leaves
        nothing carried for the optimizer to see. A backward whose hooks dynamo traced
        (compiled autograd) drops the step: nothing of it was seen, so nothing is judged."""
        if self.blind:
            self.blind = False
            if st.dropped is None:
                st.dropped = COMPILED_BACKWARD
                _log_once(self, f"diagkit: step {st.index} not observed: {COMPILED_BACKWARD}")
        if st.carried:
            holds = self.obs.holdings.holds[i]
            for k in [k for k in st.carried if holds[k]]:
                st.recheck_carried(k, local(self.obs.tensors[k].grad), restart_own=False)

    def hook_for(self, k: int) -> Callable:
        """The hook of tensor k where its `.grad` is not the gradient the backward made: on a
        view of it that autograd reaches instead (FSDP1: `measure.engines.fsdp1.ViewHooks`; `.grad`
        is FSDP's, this rank's slice, reduced), or on a tensor whose `.grad` an engine frees
        (`keep_own`). Inert while no step is observed. The gradient it sees is the tensor's
        own, whole and local, as under DDP; it is kept (`own_grad`, summed over the step's
        backwards) until the backward ends, and a `.grad` there at the first one is carried."""
        tensor = self.obs.tensors[k]

        def hook(grad):
            if not self._live():
                return None
            st = self._touch(k)
            if not st.used[k]:
                st.used[k] = True
                if tensor.grad is not None and not tensor.grad.is_meta:  # meta: no values
                    st.carried[k] = max_abs(tensor.grad)
            st.own_grad[k] = grad if k not in st.own_grad else st.own_grad[k] + grad
            return None
        return hook

    def _hook(self, k: int) -> Callable:
        """The usual hook of tensor k, whose `.grad` is what the backward accumulates into.
        Landing on an existing `.grad`, it records that one as carried and keeps the step's
        own gradient apart (`own_grad`); a later backward checks whether it was cleared."""
        obs, tensor = self.obs, self.obs.tensors[k]

        def hook(grad):
            if not self._live():
                return None
            again = k in obs.state.touched  # reached before by this same backward
            st = self._touch(k)
            if not st.used[k]:
                st.used[k] = True
                current = tensor.grad
                # Landing on an existing .grad: keep this step's own. A meta .grad has no
                # values (it would read back NaN, which means carried): not measured.
                if current is not None and not current.is_meta:
                    st.carried[k] = max_abs(current)
                    st.own_grad[k] = grad
                return None
            if k in st.carried and not again:  # a later backward: was the old .grad cleared?
                st.recheck_carried(k, tensor.grad, restart_own=True)
            if k in st.own_grad:
                st.own_grad[k] = st.own_grad[k] + grad
            return None
        return hook

    def _live(self) -> bool:
        """Whether a hook firing now records anything: not while dynamo traces it (compiled
        autograd would trace our hooks away: the step is dropped, see `blind`), nor while no
        step is observed."""
        if torch.compiler.is_compiling():
            self.blind = True
            return False
        return self.obs.active

    def _touch(self, k: int) -> StepState:
        """Autograd reached tensor k: the first such hook of a backward queues its end."""
        obs = self.obs
        st = obs.state
        if not st.backward_queued:
            if not st.touched:
                obs.progress("backward")
                if st.used[k]:  # reached before in this step: was .grad zeroed since?
                    st.resets[st.backwards] = reset_probe(local(obs.tensors[k].grad))
            st.backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        st.touched.add(k)
        return st

    def _sharded_hook(self, k: int) -> Callable:
        """FSDP2 sets a DTensor parameter's .grad itself, reduce-scattered from the unsharded
        parameter's, and then calls its post-accumulate hooks (a hook on the gradient never
        fires). `carried`: .grad is the object the hook saw last time, not rewritten through
        the DTensor since (zeroing in place bumps its version; FSDP's accumulation writes its
        shard without doing so), so this step's gradient was added to an old one. A .grad
        that was clipped and then not cleared counts as cleared; and the carried part cannot
        be told from this step's, so `grad_norm` includes it (docs/distributed.md, "FSDP2")."""
        tensor = self.obs.tensors[k]

        def hook(_param):
            if not self._live():
                return
            st, g = self._touch(k), tensor.grad
            if g is None:
                return
            if not st.used[k]:
                st.used[k] = True
                ref, version = self.last_sharded.get(k, (None, None))
                if ref is not None and ref() is g and g._version == version:
                    st.carried[k] = max_abs(local(g))
            self.last_sharded[k] = (weakref.ref(g), g._version)
        return hook

    def _backward_end(self) -> None:
        """Measure this backward's gradients: each tensor's own, where .grad holds older ones."""
        obs = self.obs
        st = obs.state
        st.backward_queued = False
        st.backwards += 1
        touched, st.touched = list(st.touched), set()
        if obs.stepping is not None:  # inside an optimizer's step(closure)
            st.in_closure = True
            obs.closure_backward(touched)
        elif st.total_is_fresh:  # after an optimizer step of the same step (a GAN's G pass)
            st.pin_totals(touched)
        own_grad, tensors = st.own_grad, obs.tensors
        own = dict(zip(touched, [tensors[k].grad for k in touched]))
        on_grad = [k for k in touched if k not in own_grad] if own_grad else touched
        if own_grad:
            own.update((k, own_grad[k]) for k in touched if k in own_grad)
        if any(g is None for g in own.values()):
            own = {k: g for k, g in own.items() if g is not None}
            on_grad = [k for k in on_grad if k in own]
        fresh = [own.get(k) for k in range(obs.n)]
        measure_fresh(st, obs.everything, list(map(local, fresh)) if obs.sharded else fresh,
                       obs.zero_grad_expected)
        st.backward_marks.append(len(st.fresh_norms))  # where this backward's norms end
        st.on_grad[on_grad] = True  # measured on .grad itself: reusable at optimizer time
        if not obs.loop.grads_untouched_until_step:
            st.grad_versions.update((k, (own[k], own[k]._version)) for k in on_grad)


def _log_once(owner, line: str) -> None:
    """One logged line per owner (a watch's hooks), however many steps it concerns."""
    if not getattr(owner, "_logged", False):
        owner._logged = True
        logging.getLogger("diagkit").warning(line)
