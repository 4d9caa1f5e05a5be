"""delta="sampled" / "off" and every=k give the verdicts of exact mode (issue 6).

Each scenario (tests/helpers/mode_scenarios.py) is built afresh with the same seed for every
mode, so the training runs are identical and only the way the change is measured differs. A
tiny `sample` forces the fingerprint and sampling paths onto these tiny models (by default
tensors of at most 4096 elements are copied exactly, which would test nothing here). One
measure on its own (the sampled estimate, every=k, bad options, the kernels) is
test_modes_measures.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import diagkit
from diagkit.measure.change import exact_probe as delta_module
from diagkit.measure.change import snapshot_pass
from diagkit.run.diagnose.loop import loop_facts, step_function
from diagkit.run.target.target import Setup
from mode_scenarios import SCENARIOS, branch, frozen_but_changing, masked_inf_held, nonfinite, run

SAMPLE = 3


@pytest.fixture(scope="module")
def exact_runs():
    return {build.__name__: run(build) for build in SCENARIOS}


@pytest.mark.parametrize("build", SCENARIOS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("mode", ["sampled", "off"])
def test_modes_give_the_verdicts_of_exact_mode(build, mode, exact_runs):
    exact = exact_runs[build.__name__]
    other = run(build, delta=mode, sample=SAMPLE)
    assert other.verdicts() == exact.verdicts()
    assert [f.code for f in other.findings] == [f.code for f in exact.findings]
    a, b = exact.steps, other.steps
    for column in ("changed", "used", "requires_grad", "carried_grad", "nonfinite"):
        assert a[column].tolist() == b[column].tolist(), column
    np.testing.assert_array_equal(a["grad_norm"].to_numpy(), b["grad_norm"].to_numpy())
    assert (b.loc[~b["changed"], "delta_norm"].fillna(0) == 0).all()
    assert other.meta["delta"] == mode
    if mode == "off":
        assert b["delta_norm"].isna().all() and b["update_ratio"].isna().all()
    else:
        small = b["name"].map(dict(zip(other.params["name"], other.params["numel"]))) <= SAMPLE
        # Snapshots here; in exact mode a frozen tensor no optimizer holds is fingerprinted
        # when observing begins and ends, never per step: its norm is NaN (not measured)
        # there, and compared where both measured it (float32 rounding of the norm: a small
        # one may sit in a bucket group here and in none there).
        both = small & a["delta_norm"].notna()
        np.testing.assert_allclose(a.loc[both, "delta_norm"], b.loc[both, "delta_norm"],
                                   rtol=1e-6)
        # Never 0 for a change: an estimate, or NaN where the change missed the sample.
        moved = b.loc[b["changed"], "delta_norm"]
        assert (moved.isna() | (moved > 0)).all()
        assert b.loc[~b["changed"] | small, "delta_norm"].notna().all()


HAND_WRITTEN = [s for s in SCENARIOS if s not in (frozen_but_changing, branch)]


@pytest.mark.parametrize("build", HAND_WRITTEN, ids=lambda b: b.__name__)
def test_unhooked_standard_loop_measures_what_hooks_measure(build, exact_runs):
    """The standard loop observes held tensors without hooks (`run.diagnose.loop.loop_facts`); the same loop
    handed over as a `train_step` gets a hook on every tensor. Both must record the same."""
    torch.manual_seed(0)
    kwargs = build()
    model, steps = kwargs.pop("model"), kwargs.pop("steps")
    setup = model if isinstance(model, Setup) else Setup(model=model, **kwargs)
    hand = Setup(model=setup.model, optimizers=setup.optimizers, lr_scheduler=setup.lr_scheduler,
                 train_step=step_function(setup))
    assert loop_facts(setup).held_grads_start_none
    assert not any(dataclasses.astuple(loop_facts(hand)))
    hooked = diagkit.diagnose(hand, steps=steps)
    pd.testing.assert_frame_equal(hooked.steps, exact_runs[build.__name__].steps)
    assert hooked.verdicts() == exact_runs[build.__name__].verdicts()


@pytest.mark.parametrize("build", [masked_inf_held, nonfinite], ids=lambda b: b.__name__)
def test_a_nan_change_is_decided_with_the_steps_read_back(build, monkeypatch):
    """A tensor holding inf or NaN makes before - after NaN. Known to hold them (from the norms
    read back at attach, then from step to step), it is decided element by element in `end()`
    while its value before still exists (`change_parts`), riding with the step's one read-back:
    no host reads of its own in `resolve()`. Forgetting what is known (so that it is decided
    from before - after alone: chunk by chunk in the snapshot pass of `end()` on the CPU
    (`measure.change.snapshot_pass`), else in `resolve()`) decides the same on these runs."""
    calls, phase = [], []

    def spy(name, real):
        def counted(*args, **kwargs):
            calls.append((name, phase[-1] if phase else None))
            return real(*args, **kwargs)
        return counted

    def in_phase(name, method):
        def wrapped(self, *args, **kwargs):
            phase.append(name)
            try:
                return method(self, *args, **kwargs)
            finally:
                phase.pop()
        return wrapped
    monkeypatch.setattr(delta_module, "change_parts",
                        spy("parts", delta_module.change_parts))
    monkeypatch.setattr(delta_module, "nonfinite_change",
                        spy("host", delta_module.nonfinite_change))
    monkeypatch.setattr(snapshot_pass, "nonfinite_change",
                        spy("pass", snapshot_pass.nonfinite_change))
    probe = delta_module.ExactProbe
    monkeypatch.setattr(probe, "end", in_phase("end", probe.end))
    monkeypatch.setattr(probe, "resolve_into", in_phase("resolve", probe.resolve_into))
    four = lambda: build() | {"steps": 4}  # noqa: E731
    queued = run(four)
    assert ("host", "resolve") not in calls, calls  # nothing decided on its own host read
    assert calls.count(("parts", "end")) >= 3, calls  # each step once it holds them: queued

    end = delta_module.ExactProbe.end

    def end_knowing_nothing(self, pending, tag="x"):
        self._careful = set()
        return end(self, pending, tag)
    monkeypatch.setattr(delta_module.ExactProbe, "end", end_knowing_nothing)
    calls.clear()
    direct = run(four)
    assert ("host", "resolve") in calls or ("pass", "end") in calls, calls
    pd.testing.assert_frame_equal(queued.steps, direct.steps)
