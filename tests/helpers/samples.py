"""Results the presenter tests share: the demos diagnosed once, a run whose step failed, a
hostile module name, and large synthetic tables with every documented column."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import torch
from torch import nn

import diagkit
from diagkit.core.schema import PARAMS_COLUMNS, STEPS_COLUMNS


MEM = "module.metamodel.model.mem_tokens"


HOSTILE = "<script>alert(1)</script>"


@functools.cache
def demo(name: str):
    return diagkit.diagnose(diagkit.load_target(f"diagkit.demos:{name}"))


@functools.cache
def failing_run(at: int = 0):
    """A real diagnosis whose step `at` raised (at=0: params, and no steps at all)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        if i == at:
            raise RuntimeError("boom <b>bad</b>")
        optimizer.zero_grad()
        model(torch.randn(3, 2)).pow(2).mean().backward()
        optimizer.step()

    return diagkit.diagnose(model, optimizer, train_step=step, steps=5)


@functools.cache
def hostile_diag():
    """A real model with a module named like a script, unused, so it is in every output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    model.add_module(HOSTILE, nn.Linear(2, 2))  # torch allows any name without a dot
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, optimizer, batch_fn=lambda: torch.randn(3, 4),
                            loss_fn=lambda m, x: m[0](x).pow(2).mean(), steps=3)


ORPHANS = (0, 1, 2)


UNUSED = tuple(range(100, 110))


STALLED = tuple(range(200, 205))


@functools.cache
def synthetic(n_tensors: int = 2000, n_steps: int = 200, n_top: int = 25):
    """(params, steps) with every documented column: 3 orphans whose .grad rises, 10 unused,
    5 stalled, spread over `n_top` top-level modules; the rest ok."""
    rng = np.random.default_rng(0)
    idx = np.arange(n_tensors)
    names = np.array([f"m{i % n_top}.block{i // n_top}.{'bias' if i % 2 else 'weight'}"
                      for i in idx], dtype=object)
    modules = np.array([n.rpartition(".")[0] for n in names], dtype=object)
    held = ~np.isin(idx, ORPHANS)
    used = ~np.isin(idx, UNUSED)
    changes = held & used & ~np.isin(idx, STALLED)

    grad = rng.lognormal(-3, 1, size=(n_steps, n_tensors))
    grad[:, ~used] = np.nan
    total = grad.copy()
    total[:, list(ORPHANS)] = np.cumsum(grad[:, list(ORPHANS)], axis=0)
    ratio = np.where(changes, rng.lognormal(-7, 0.5, size=(n_steps, n_tensors)), 0.0)
    ratio[:, 300] = np.nan  # a tensor whose value norm is 0: no ratio
    carried = np.zeros((n_steps, n_tensors), dtype=bool)
    carried[1:, list(ORPHANS)] = True
    flat = {
        "step": np.repeat(np.arange(n_steps), n_tensors),
        "name": np.tile(names, n_steps),
        "requires_grad": True,
        "used": np.tile(used, n_steps),
        "grad_norm": grad.ravel(),
        "grad_total_norm": total.ravel(),
        "carried_grad": carried.ravel(),
        "delta_norm": (ratio * 10).ravel(),
        "update_ratio": ratio.ravel(),
        "changed": np.tile(changes, n_steps),
        "lr": np.tile(np.where(held, 1e-3, np.nan), n_steps),
        "nonfinite": False,
        "skipped": False,
    }
    steps = pd.DataFrame(flat, columns=list(STEPS_COLUMNS))

    verdicts = [("ok",)] * n_tensors
    for i in ORPHANS:
        verdicts[i] = ("orphan", "grad_not_cleared")
    for i in UNUSED:
        verdicts[i] = ("unused",)
    for i in STALLED:
        verdicts[i] = ("stalled",)
    numel = rng.integers(16, 1 << 20, size=n_tensors)
    params = pd.DataFrame({
        "name": names,
        "aliases": [()] * n_tensors,
        "module": modules,
        "module_type": np.where(idx % 7 == 0, "LayerNorm", "Linear"),
        "shape": [(int(n),) for n in numel],
        "numel": numel,
        "bytes": numel * 4,
        "dtype": "torch.float32",
        "device": "cpu",
        "placement": "",
        "stage": "",
        "in_model": True,
        "requires_grad": True,
        "optimizer": pd.array(np.zeros(n_tensors, dtype=int), dtype="Int64"),
        "group": pd.array(idx % 2, dtype="Int64"),
        "memberships": [((0, int(i % 2)),) if h else () for i, h in zip(idx, held)],
        "n_optimizers": held.astype(int),
        "lr": np.where(held, 1e-3, np.nan),
        "weight_decay": np.where(held, 0.01, np.nan),
        "steps": n_steps,
        "rg_steps": n_steps,
        "used_steps": np.where(used, n_steps, 0),
        "changed_steps": np.where(changes, n_steps, 0),
        "carried_steps": np.where(np.isin(idx, ORPHANS), n_steps - 1, 0),
        "nonfinite_steps": 0,
        "skipped_steps": 0,
        "grad_norm": grad[-1],
        "grad_total_norm": total[-1],
        "delta_norm": (ratio * 10).mean(axis=0),
        "update_ratio": ratio.mean(axis=0),
        "verdicts": verdicts,
    }, columns=list(PARAMS_COLUMNS))
    params.loc[~held, ["optimizer", "group"]] = pd.NA
    return params, steps
