"""What the observer knows about the step in progress, and what the loop promises about it.

`StepState` is made fresh by `Observer.begin_step` and read once by `Observer.end_step`; the
observation strategies (`diagkit.measure.step.gradients`, `backward_hooks`) fill it as the step
runs. Arrays are indexed like the inventory's tensors (`k`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from ..batched.kernels import max_abs


@dataclasses.dataclass(frozen=True)
class LoopFacts:
    """What the loop that runs the steps guarantees to the observer; each lets it skip work.

    `grads_untouched_until_step`: nothing runs between backward and `optimizer.step()` (no
    clipping, unscaling, accumulation), so every .grad measured when backward ended is what the
    optimizer sees, unchecked. `held_grads_start_none`: each optimizer's
    `zero_grad(set_to_none=True)` runs right before the step's one backward and no process group
    reduces gradients, so a tensor an optimizer holds was reached by autograd exactly when its
    .grad is set as the optimizer steps: it needs no hook. Neither holds for a loop diagkit does
    not run (the default). `may_earn_shares`: no process group reduces gradients, so the loop
    may show at run time that it behaves as the standard one (`EarnedShare`).
    """

    grads_untouched_until_step: bool = False
    held_grads_start_none: bool = False
    may_earn_shares: bool = False

    @property
    def hookless_shares(self) -> bool:
        """Whether held tensors are observed from .grad at optimizer time, without a hook."""
        return self.grads_untouched_until_step and self.held_grads_start_none


@dataclasses.dataclass
class StepState:
    """One observed step, as it runs. Tensors are named by their index `k`."""

    index: int
    # Per tensor, read when its first optimizer steps (or at the end of the step if none does).
    used: np.ndarray            # bool: autograd accumulated a gradient into it
    read: np.ndarray            # bool: requires_grad, lr and .grad already read this step
    requires_grad: np.ndarray   # bool
    lr: np.ndarray              # float: its first group's lr (NaN if no optimizer holds it)
    # The backward in progress (hooked tensors only).
    touched: set[int] = dataclasses.field(default_factory=set)  # reached by this backward
    backward_queued: bool = False  # its end-of-backward callback is queued
    # k -> this step's own gradient, where the first accumulation landed on an older .grad.
    own_grad: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    # k -> max |.grad| that the first accumulation landed on (non-zero: carried over).
    carried: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    # Fresh-gradient norms queued for the read-back: [(ks, norms)], one entry per piece.
    fresh_norms: list = dataclasses.field(default_factory=list)
    # Each backward's gradients as measured, [(layout, grads)], to look at one again when its
    # norm comes out 0 or non-finite; a later backward of the step supersedes an earlier one.
    fresh_grads: list = dataclasses.field(default_factory=list)
    # k -> max |fresh gradient|, queued where an exact zero is expected.
    fresh_zero: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    # Per tensor: its fresh gradient was measured on .grad itself (no older .grad under it).
    on_grad: np.ndarray | None = None
    # k -> (.grad object, its version) when measured: reusable at optimizer time if unchanged.
    grad_versions: dict[int, tuple[torch.Tensor, int]] = dataclasses.field(default_factory=dict)
    # Per optimizer: its step pre-hook fired during the step (False: skipped, e.g. a loss scaler).
    stepped: np.ndarray | None = None
    # len(fresh_norms) as each hooked backward ended: where each backward's norms end.
    backward_marks: list[int] = dataclasses.field(default_factory=list)
    # Hooked backward (by index) -> what it found in the .grad of a tensor an earlier backward
    # of the step reached: None (reset to None), or max |.grad| over its first elements (0:
    # zeroed in place). Either way a new iteration of the loop (zero_grad) began in between.
    resets: dict[int, torch.Tensor | None] = dataclasses.field(default_factory=dict)
    # Backward passes that reached a hooked tensor, and whether one ran inside step(closure).
    backwards: int = 0
    in_closure: bool = False
    # Why this step cannot be recorded (an `EarnedShare` lapsed during it), or None.
    dropped: str | None = None
    # k -> norm of the .grad the optimizer sees, where it is not the fresh gradient's norm.
    total_norms: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    # Index arrays of tensors whose .grad norm is their fresh norm (nothing rewrote .grad).
    total_is_fresh: list[np.ndarray] = dataclasses.field(default_factory=list)
    # (reused, probed, norms): .grad norms taken again at optimizer time (`measure.step.rewrites`),
    # and whether one showed .grad rewritten in place without a version bump.
    rewrite_probes: list = dataclasses.field(default_factory=list)
    rewritten: bool = False

    @classmethod
    def begin(cls, index: int, n: int, n_optimizers: int = 0) -> "StepState":
        return cls(index=index, used=np.zeros(n, dtype=bool), read=np.zeros(n, dtype=bool),
                   requires_grad=np.zeros(n, dtype=bool), lr=np.full(n, math.nan),
                   on_grad=np.zeros(n, dtype=bool),
                   stepped=np.zeros(n_optimizers, dtype=bool))

    def recheck_carried(self, k: int, grad: torch.Tensor | None, restart_own: bool) -> None:
        """Tensor k's first gradient of the step landed on an older .grad (`carried`); `grad`
        is its .grad later (before a later backward adds to it, or as an optimizer steps).
        Reset to None, or zeroed in place (all zero: read back with the step), the old
        gradient is gone: nothing is carried into what the optimizer steps on. `restart_own`:
        the step's own gradient restarts there too (what came before was discarded)."""
        if grad is None:
            self.carried.pop(k, None)
            if restart_own:
                self.own_grad.pop(k, None)
            return
        zeroed = max_abs(grad) == 0
        self.carried[k] = torch.where(zeroed, torch.zeros_like(self.carried[k]),
                                      self.carried[k])
        if restart_own and k in self.own_grad:
            own = self.own_grad[k]
            self.own_grad[k] = torch.where(zeroed, own.new_zeros(()), own)

    def forget_reads(self, ks: np.ndarray) -> None:
        """Read `ks` again: a backward inside an optimizer's `step(closure)` (Lightning, LBFGS)
        came after its step pre-hook read their .grad, so what it read was the old one."""
        self.read[ks] = False
        for k in ks.tolist():
            self.total_norms.pop(k, None)
        self.total_is_fresh = [a[~np.isin(a, ks)] for a in self.total_is_fresh]

    def pin_totals(self, ks: list[int]) -> None:
        """A later backward of the step reaches `ks`: where an optimizer already read .grad and
        took its norm to be the fresh one, pin that norm now (the later backward supersedes the
        fresh norms), so the total stays what the optimizer saw (a GAN's D before G's pass)."""
        reused = (np.concatenate(self.total_is_fresh) if self.total_is_fresh
                  else np.zeros(0, dtype=np.int64))
        reused = set(reused.tolist())
        pin = [k for k in ks if k in reused]
        for k in pin:
            for kk, values in reversed(self.fresh_norms):
                where = np.flatnonzero(np.asarray(kk) == k)
                if len(where):
                    self.total_norms[k] = values[int(where[0])]
                    break
        if pin:
            self.total_is_fresh = [a[~np.isin(a, pin)] for a in self.total_is_fresh]

    def release(self) -> None:
        """Drop the step's references to gradients (they may be large) once it is recorded."""
        self.own_grad = {}
        self.fresh_grads = []
        self.grad_versions = {}
