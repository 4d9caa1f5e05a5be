"""`DiagkitCallback` on a real Lightning `Trainer.fit`, for both packages Lightning ships as
(`lightning` and `pytorch_lightning`): optimizer steps counted through
`accumulate_grad_batches` and the closure Lightning runs inside `optimizer.step`, every hook
removed when training ends or raises, and a bad option failing as the callback is built."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from torch import nn

import diagkit
from integration_helpers import NO_HOOKS, hooks_left, observed_steps

L = pytest.importorskip("lightning.pytorch")

from diagkit.integrations.lightning import DiagkitCallback  # noqa: E402


def module_class(base):
    """A LightningModule on `base` with a head the forward never calls (`unused`)."""

    class WithDeadHead(base):
        def __init__(self, fail_at=None, manual=False):
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.dead = nn.Linear(4, 2)
            self.fail_at, self.automatic_optimization = fail_at, not manual

        def training_step(self, batch, batch_idx):
            if batch_idx == self.fail_at:
                raise RuntimeError("the user's own error")
            loss = self.body(batch[0]).pow(2).mean()
            if not self.automatic_optimization:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return WithDeadHead


def loader(n=32):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer(package, tmp_path, callback, **overrides):
    values = dict(max_steps=4, accelerator="cpu", devices=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path, callbacks=[callback])
    values.update(overrides)
    return package.Trainer(**values)


def fit(package, tmp_path, callback, module=None, **overrides):
    torch.manual_seed(0)
    module = module or module_class(package.LightningModule)()
    t = trainer(package, tmp_path, callback, **overrides)
    t.fit(module, loader())
    return t, module


def test_accumulated_batches_and_clipping_count_as_optimizer_steps(tmp_path):
    callback = DiagkitCallback(steps=50, out=tmp_path / "diag")
    t, module = fit(L, tmp_path, callback, accumulate_grad_batches=2, gradient_clip_val=0.5)
    # ended by the end of training (reading `diagnosis` would end it too: not yet)
    assert callback.watch.done and hooks_left(module, t.optimizers) == NO_HOOKS
    diag = callback.diagnosis
    assert t.global_step == 4 and t.fit_loop.total_batch_idx + 1 == 8  # 8 batches, 4 steps
    assert observed_steps(diag) == [0, 1, 2, 3] and diag.meta["optimizer_steps"] == 4
    assert diag.verdicts() == {"body.weight": {"ok"}, "body.bias": {"ok"},
                               "dead.weight": {"unused"}, "dead.bias": {"unused"}}
    assert diagkit.load(tmp_path / "diag").verdicts() == diag.verdicts()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diag"]  # nothing else written


def test_detaches_by_itself_after_steps(tmp_path):
    callback = DiagkitCallback(steps=2)
    t, module = fit(L, tmp_path, callback, max_steps=5)
    assert callback.watch.done and callback.diagnosis.meta["optimizer_steps"] == 2
    assert t.global_step == 5 and hooks_left(module, t.optimizers) == NO_HOOKS


def test_manual_optimization_through_lightnings_optimizer(tmp_path):
    callback = DiagkitCallback(steps=50)
    t, module = fit(L, tmp_path, callback, module=module_class(L.LightningModule)(manual=True))
    assert callback.watch.done and hooks_left(module, t.optimizers) == NO_HOOKS
    assert callback.diagnosis.meta["optimizer_steps"] == 4
    assert callback.diagnosis.verdicts()["dead.weight"] == {"unused"}


def test_a_training_step_that_raises_ends_the_watch_and_keeps_the_steps(tmp_path):
    callback = DiagkitCallback(steps=50)
    module = module_class(L.LightningModule)(fail_at=3)
    t = trainer(L, tmp_path, callback)
    with pytest.raises(RuntimeError, match="the user's own error"):
        t.fit(module, loader())
    assert callback.watch.done and observed_steps(callback.diagnosis) == [0, 1, 2]
    assert hooks_left(module, t.optimizers) == NO_HOOKS


def test_pytorch_lightning_gets_a_callback_of_its_own_package(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from diagkit.integrations.pytorch_lightning import DiagkitCallback as PLCallback
    callback = PLCallback(steps=50)
    assert isinstance(callback, pl.Callback) and not isinstance(callback, L.Callback)
    assert isinstance(DiagkitCallback(), L.Callback) and not isinstance(DiagkitCallback(),
                                                                         pl.Callback)
    t, module = fit(pl, tmp_path, callback, accumulate_grad_batches=2)
    assert callback.watch.done and hooks_left(module, t.optimizers) == NO_HOOKS
    assert callback.diagnosis.meta["optimizer_steps"] == 4
    assert callback.diagnosis.verdicts()["dead.bias"] == {"unused"}


def test_the_other_packages_callback_still_works_and_says_which_to_use(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    callback = DiagkitCallback(steps=50)
    with pytest.warns(UserWarning, match="diagkit.integrations.pytorch_lightning"):
        fit(pl, tmp_path, callback, max_steps=2)
    assert callback.diagnosis.meta["optimizer_steps"] == 2


@pytest.mark.parametrize("options, message", [
    ({"steps": -1}, "steps must be a positive int"),
    ({"sample": 0}, "sample must be a positive int"),
    ({"delta": None}, "delta must be one of"),
    ({"outdir": "x"}, "unknown option 'outdir'"),
])
def test_a_bad_option_fails_as_the_callback_is_built(options, message):
    with pytest.raises(diagkit.DiagkitError, match=message) as err:
        DiagkitCallback(**options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("module, blocked, hint", [
    ("diagkit.integrations.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"),
     "diagkit[lightning]"),
    ("diagkit.integrations.pytorch_lightning", ("pytorch_lightning",), "pytorch-lightning"),
])
def test_without_lightning_the_import_says_how_to_install(monkeypatch, module, blocked, hint):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(diagkit.DiagkitError, match=f"pip install {hint}".replace("[", r"\[")
                       .replace("]", r"\]")) as err:
        importlib.import_module(module)
    assert "\n" not in str(err.value)


def test_with_only_pytorch_lightning_installed_the_lightning_module_uses_it(monkeypatch):
    pl = pytest.importorskip("pytorch_lightning")
    for name in ("lightning", "lightning.pytorch"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "diagkit.integrations.lightning", raising=False)
    fallback = importlib.import_module("diagkit.integrations.lightning")
    assert issubclass(fallback.DiagkitCallback, pl.Callback)


def test_an_orphan_points_at_the_users_configure_optimizers(tmp_path):
    """The optimizer is built in the user's `configure_optimizers`, which Lightning calls
    between `setup` and `on_train_start`: the finding shows those lines and its fix names
    that hook, not `optimizer.add_param_group`. The patches that note it come off again."""

    class HeadLeftOut(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.head(torch.relu(self.body(batch[0]))).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.body.parameters(), lr=0.1)  # MARK-configure

    init, add = torch.optim.Optimizer.__init__, torch.optim.Optimizer.add_param_group
    callback = DiagkitCallback(steps=2)
    fit(L, tmp_path, callback, module=HeadLeftOut())
    assert (torch.optim.Optimizer.__init__, torch.optim.Optimizer.add_param_group) == (init, add)
    orphan = next(f for f in callback.diagnosis.findings if f.code == "orphan")
    assert orphan.params == ("head.weight", "head.bias")
    (source,) = orphan.source
    assert source["function"] == "configure_optimizers" and source["file"] == __file__
    assert "MARK-configure" in source["lines"][0]
    assert "configure_optimizers" in orphan.fix and "add_param_group" not in orphan.fix
    assert "test_lightning_callback.py:" in orphan.fix
    # written as configure_optimizers names the module: self, not model
    assert "include list(self.head.parameters()) in the params it passes" in orphan.fix
