"""`unregistered` under real torch.distributed: torchrun, 2 gloo ranks, each rank finding the
tensors in its own graph; rank 0 gathers the rows found after the inventory was written."""

from pathlib import Path

import pytest

from diagkit.run.diagnose.launcher import diagnose_distributed

TARGET = f"{Path(__file__).resolve().parents[1] / 'helpers' / 'unregistered_targets.py'}:build"
LOOSE = ["layers[0].bias", "layers[0].weight", "layers[1].bias", "layers[1].weight",
         "logit_scale"]


@pytest.mark.parametrize("wrap", [False, True], ids=["diagkit_wraps", "target_wraps"])
def test_unregistered_under_ddp_two_ranks(wrap):
    diag = diagnose_distributed(TARGET, {"wrap": wrap}, nproc=2, steps=3, measure_cost=False)
    assert diag.failure is None
    prefix = "module." if wrap else ""
    verdicts = diag.verdicts()
    found = {n for n, vs in verdicts.items() if "unregistered" in vs}
    assert found == {prefix + n for n in LOOSE}
    assert verdicts[prefix + "head.weight"] == {"ok"}
    steps = diag.steps[diag.steps["name"] == prefix + "logit_scale"]
    assert sorted(set(steps["rank"])) == [0, 1] and len(steps) == 6
    assert steps["used"].all() and steps["checksum"].notna().all()
    [finding] = [f for f in diag.findings if f.code == "unregistered"
                 and f.module == prefix + "layers"]
    assert "nn.ModuleList" in finding.fix and finding.count == 4
