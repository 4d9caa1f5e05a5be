"""DeepSpeed ZeRO through the frameworks that build the engine for the user, under a real torchrun
of 2 processes (DS_ACCELERATOR=cpu: gloo; docs/distributed.md, "Engines: what is observed, what is
refused"):

- accelerate with a `DeepSpeedPlugin` (stages 1, 2, 3): `diagkit.watch(model, optimizer)` on
  what `accelerator.prepare` returns (the engine, and accelerate's `DeepSpeedOptimizerWrapper`
  over ZeRO's optimizer), whose ZeRO step runs inside `accelerator.backward`. Each with a
  planted orphan and its clean twin, every measurement checked against the same model, data
  and bug under DDP.
- the HF `Trainer` with a DeepSpeed config (stages 2 and 3) and `DiagkitCallback`: an
  optimizer without the classifier's head (an orphan; built in `create_optimizer`, since under
  DeepSpeed the Trainer drops an optimizer passed as `optimizers=`), and the Trainer's own
  optimizer (the clean twin), 2 micro-batches per step. On this CPU the Trainer needs `use_cpu=True`
  (else accelerate sees no process group and DeepSpeed's batch check fails); accelerate needs
  its process group named (`InitProcessGroupKwargs(backend="gloo")`).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobs import same_norm, torchrun_program

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0",
       "PYTHONPATH": os.pathsep.join(map(str, (ROOT / "src", ROOT / "tests" / "helpers")))}
STEPS = 3

PROGRAM = textwrap.dedent('''
    import json, sys, tempfile
    import torch, torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from transformers import Trainer, TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    import diagkit
    from diagkit.integrations.transformers import DiagkitCallback
    from integration_helpers import Sequences, tiny_classifier

    STEPS = 3

    from models import TwoHeads as Net, rank_batches, two_heads_groups, watched_under_ddp

    def groups(model, planted):
        return two_heads_groups(dict(model.named_parameters()), planted)

    def batches(n):
        return rank_batches(n, dist.get_rank())

    def summary(d):
        if d is None:
            return None
        return {"verdicts": {k: sorted(v) for k, v in d.verdicts().items()},
                "errors": sorted({f.code for f in d.findings if f.severity == "error"}),
                "steps": {f"{r.step} {r.name}": [r.grad_norm, r.delta_norm]
                          for r in d.steps.itertuples()},
                "observed": sorted(set(d.steps["step"])), "wrappers": d.meta.get("wrappers")}

    def fresh():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        unset_hf_deepspeed_config()

    def accelerate_run(stage, planted):
        fresh()
        plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=0.0)
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 4
        plugin.deepspeed_config["zero_allow_untested_optimizer"] = True
        plugin.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        acc = Accelerator(deepspeed_plugin=plugin,
                          kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
        torch.manual_seed(0)
        model = Net()
        model, opt = acc.prepare(model, torch.optim.Adam(groups(model, planted), lr=0.01))
        w = diagkit.watch(model, opt, steps=STEPS)
        for x in batches(STEPS):
            acc.backward(model(x))
            opt.step()
            opt.zero_grad()
        return summary(w.diagnosis), type(opt).__name__

    class HeadLeftOut(Trainer):
        """Under DeepSpeed the Trainer drops `optimizers=(opt, None)` (deepspeed_init sets
        trainer.optimizer = None): its lever is `create_optimizer`, here with a name filter
        that misses the classifier's head (`score`)."""

        def create_optimizer(self, model=None):
            if self.optimizer is None:
                self.optimizer = torch.optim.AdamW(
                    [p for n, p in self.model.named_parameters() if n.startswith("model.")],
                    lr=1e-3, weight_decay=0.0)
            return self.optimizer

    def trainer_run(stage, planted):
        fresh()
        model = tiny_classifier()
        ds = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": "auto", "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(), deepspeed=ds, use_cpu=True, max_steps=3,
            per_device_train_batch_size=4, gradient_accumulation_steps=2, seed=0, report_to=[],
            save_strategy="no", logging_strategy="no", disable_tqdm=True)
        callback = DiagkitCallback(steps=STEPS)
        trainer = (HeadLeftOut if planted else Trainer)(
            model=model, args=args, train_dataset=Sequences(), callbacks=[callback])
        trainer.train()
        out = summary(callback.diagnosis)
        if out is not None:
            out["engine"] = type(trainer.model_wrapped).__name__
            out["global_step"] = trainer.state.global_step
        return out

    out = {}
    dist.init_process_group("gloo")
    for planted in (True, False):  # the oracle: the same model, data and bug under DDP
        out[f"ddp {planted}"] = summary(watched_under_ddp(planted, STEPS).diagnosis)
    for stage in (1, 2, 3):
        for planted in (True, False):
            out[f"accelerate {stage} {planted}"], out["wrapper"] = accelerate_run(stage, planted)
    for stage, planted in ((2, True), (3, True), (3, False)):
        out[f"trainer {stage} {planted}"] = trainer_run(stage, planted)
    if dist.get_rank() == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return torchrun_program(tmp_path_factory.mktemp("ds_frameworks"), PROGRAM, 2, ENV,
                            timeout=500)




@pytest.mark.parametrize("planted", [True, False])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_accelerate_with_a_deepspeed_plugin(job, stage, planted):
    got, oracle = job[f"accelerate {stage} {planted}"], job[f"ddp {planted}"]
    assert job["wrapper"] == "DeepSpeedOptimizerWrapper"
    assert got["errors"] == (["orphan"] if planted else [])
    for name, verdicts in got["verdicts"].items():
        assert verdicts == (["grad_not_cleared", "orphan"] if planted and name.startswith("head2.")
                            else ["ok"]), name
    assert got["observed"] == list(range(STEPS)) and got["wrappers"] == ["DeepSpeedEngine"]
    assert set(got["steps"]) == set(oracle["steps"])
    for key, (grad, delta) in oracle["steps"].items():
        assert all(map(same_norm, got["steps"][key], (grad, delta))), key


@pytest.mark.parametrize("stage", [2, 3])
def test_the_hf_trainer_with_a_deepspeed_config_finds_the_orphan(job, stage):
    got = job[f"trainer {stage} True"]
    assert got["engine"] == "DeepSpeedEngine" and got["global_step"] == 3
    assert got["errors"] == ["orphan"]
    assert "orphan" in got["verdicts"].pop("score.weight")
    assert {v for vs in got["verdicts"].values() for v in vs} == {"ok"}
    # one step per optimizer step (2 micro-batches each), not per micro-batch
    assert got["observed"] == [0, 1, 2]


def test_the_hf_trainers_own_optimizer_under_zero3_is_all_ok(job):
    got = job["trainer 3 False"]
    assert got["errors"] == [] and got["observed"] == [0, 1, 2]
    assert {v for vs in got["verdicts"].values() for v in vs} == {"ok"}
