"""Bitwise save and restore of everything a diagnosis run touches.

A diagnosis takes real optimizer steps. With `restore=True` the user must get back the exact
model, buffers, optimizer state, `.grad`s, requires_grad flags, module modes and RNG streams,
so that diagnosing in the middle of a notebook changes nothing. Copies go to host memory so
that restore costs no accelerator memory; identity of every tensor object is preserved
(optimizers hold tensors by identity).
"""

from __future__ import annotations

import copy
import random

import torch


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy in host memory. A tensor on the meta device has no values to copy: it stays a
    meta tensor (no memory), and copying it back changes nothing (an optimizer built before
    `to_empty()` holds such tensors, and its state too)."""
    if t.is_meta:
        return t.detach().clone()
    return t.detach().to("cpu", copy=True)


class SavedState:
    """Captured at construction; `restore()` puts it all back."""

    def __init__(self, model, tensors, optimizers, lr_scheduler=None):
        self.model = model
        self.modules = list(model.modules())
        self.module_params = [dict(m._parameters) for m in self.modules]
        self.module_buffers = [dict(m._buffers) for m in self.modules]
        self.training = [m.training for m in self.modules]
        self.tensors = list(tensors)
        self.values = [_host_copy(t) for t in self.tensors]
        self.requires_grad = [t.requires_grad for t in self.tensors]
        self.grads = [t.grad for t in self.tensors]  # the objects, to put back by identity
        self.grad_values = [None if g is None else _host_copy(g) for g in self.grads]
        self.buffers = [(b, _host_copy(b)) for b in _unique_buffers(model)]
        self.optimizers = list(optimizers)
        self.opt_states = [_save_optimizer(opt) for opt in self.optimizers]
        self.scheduler = lr_scheduler
        self.scheduler_state = (copy.deepcopy(lr_scheduler.state_dict())
                                if lr_scheduler is not None and hasattr(lr_scheduler, "state_dict")
                                else None)
        self.rng = _save_rng()

    def restore(self) -> None:
        with torch.no_grad():
            for module, params, buffers, training in zip(
                    self.modules, self.module_params, self.module_buffers, self.training):
                module._parameters.clear()
                module._parameters.update(params)
                module._buffers.clear()
                module._buffers.update(buffers)
                module.training = training
            for t, value, rg, grad, grad_value in zip(self.tensors, self.values,
                                                      self.requires_grad, self.grads,
                                                      self.grad_values):
                t.copy_(value)
                t.requires_grad_(rg)
                if grad is not None:
                    grad.copy_(grad_value)
                t.grad = grad
            for buf, value in self.buffers:
                buf.copy_(value)
        for opt, saved in zip(self.optimizers, self.opt_states):
            _restore_optimizer(opt, saved)
        if self.scheduler_state is not None:
            self.scheduler.load_state_dict(copy.deepcopy(self.scheduler_state))
        _restore_rng(self.rng)


def _unique_buffers(model):
    seen = set()
    for _, buf in model.named_buffers(remove_duplicate=False):
        if id(buf) not in seen:
            seen.add(id(buf))
            yield buf


def _save_optimizer(opt):
    groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
              for g in opt.param_groups]
    params = [list(g["params"]) for g in opt.param_groups]
    state = {p: {k: (v, _host_copy(v)) if isinstance(v, torch.Tensor) else (None, copy.deepcopy(v))
                 for k, v in s.items()}
             for p, s in opt.state.items()}
    return groups, params, state, opt.param_groups[:]


def _restore_optimizer(opt, saved):
    groups, params, state, group_objects = saved
    opt.param_groups[:] = group_objects
    for group, hyper, plist in zip(group_objects, groups, params):
        group.clear()
        group.update(copy.deepcopy(hyper))
        group["params"] = plist
    opt.state.clear()
    with torch.no_grad():
        for p, entries in state.items():
            restored = {}
            for k, (obj, value) in entries.items():
                if obj is None:
                    restored[k] = copy.deepcopy(value)
                else:
                    obj.copy_(value)
                    restored[k] = obj
            opt.state[p] = restored


def _save_rng():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
