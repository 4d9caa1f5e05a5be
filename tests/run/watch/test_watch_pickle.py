"""A watched model saves, pickles, deep-copies and `state_dict()`s as an unwatched one does:
no copy carries diagkit's hooks, and nothing of diagkit is left after `stop()`
(`diagkit.measure.model.hook_ref`)."""

import copy
import gc
import io
import pickle
import tracemalloc

import pytest
import torch
from torch import nn

import diagkit

pytestmark = pytest.mark.filterwarnings("error")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 2)
        self.scale = torch.ones(2, requires_grad=True)  # outside .parameters(): unregistered

    def forward(self, x):
        return (self.b(torch.relu(self.a(x))) * self.scale).pow(2).mean()


def _diagkit(obj) -> bool:
    return type(obj).__module__.startswith("diagkit")


def diagkit_hooks(model, optimizers=()) -> list:
    """Every entry of diagkit's in the hook dicts of `model`'s modules, tensors, optimizers."""
    found = []
    for module in model.modules():
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks"):
            found += [h for h in getattr(module, name).values()]
        found += list(module._forward_hooks_with_kwargs)
    tensors = list(model.parameters()) + [model.scale]
    for t in tensors:
        found += list((t._backward_hooks or {}).values())
        found += list((t._post_accumulate_grad_hooks or {}).values())
    for opt in optimizers:
        found += list(opt._optimizer_step_pre_hooks.values())
        found += list(opt._optimizer_step_post_hooks.values())
    return found


def _train(model, opt, n=2, accumulate=1):
    for _ in range(n):
        opt.zero_grad()
        for _ in range(accumulate):
            model(torch.randn(4, 8)).backward()
        opt.step()


def _watched(mode):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(list(model.parameters()) + [model.scale], lr=0.1)
    if mode == "none":
        w = diagkit.watch(model, steps=5)
    else:
        w = diagkit.watch(model, opt, steps=5)
    return model, opt, w, (2 if mode == "accumulation" else 1)


MODES = ["optimizer", "none", "accumulation"]


@pytest.mark.parametrize("mode", MODES)
def test_torch_save_mid_watch_loads_a_model_free_of_diagkit(mode):
    model, opt, w, acc = _watched(mode)
    _train(model, opt, accumulate=acc)
    assert diagkit_hooks(model, [opt])  # mid-watch: hooked
    buffer = io.BytesIO()
    torch.save(model, buffer)
    pickle.dumps(model)
    assert model.state_dict().keys() == Net().state_dict().keys()
    _train(model, opt, n=4, accumulate=acc)  # the watch goes on and ends
    w.stop()
    assert not diagkit_hooks(model, [opt])
    assert w.diagnosis is not None and len(w.diagnosis.steps)

    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    # Saved mid-watch, its hook entry is inert: it holds nothing of the watch...
    assert all(type(h).__name__ == "_Removed" for h in diagkit_hooks(loaded)
               if _diagkit(h)), diagkit_hooks(loaded)
    loaded_opt = torch.optim.SGD(list(loaded.parameters()) + [loaded.scale], lr=0.1)
    before = loaded.a.weight.detach().clone()
    _train(loaded, loaded_opt, accumulate=acc)  # ...and it trains, and is gone at once
    assert not diagkit_hooks(loaded, [loaded_opt])
    assert not torch.equal(before, loaded.a.weight)


@pytest.mark.parametrize("mode", MODES)
def test_deepcopy_mid_watch_carries_no_hook(mode):
    model, opt, w, acc = _watched(mode)
    _train(model, opt, accumulate=acc)
    twin, twin_opt = copy.deepcopy((model, opt))
    assert not diagkit_hooks(twin, [twin_opt])
    assert diagkit_hooks(model, [opt])
    ema = copy.deepcopy(model)
    assert not diagkit_hooks(ema)
    _train(model, opt, n=4, accumulate=acc)
    w.stop()
    assert not diagkit_hooks(model, [opt])
    assert not diagkit_hooks(twin, [twin_opt]) and not diagkit_hooks(ema)
    _train(twin, twin_opt, accumulate=acc)  # the copies train, unwatched


def _grown(model, n):
    """Bytes still held after `n` forward+backward passes of `model`."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            model(torch.randn(4, 8)).backward()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_a_copys_memory_stays_flat_during_and_after_the_watch():
    model, opt, w, _ = _watched("optimizer")
    _train(model, opt)
    twin = copy.deepcopy(model)
    _grown(twin, 20)  # warm up
    assert _grown(twin, 1000) < 64_000  # during the watch
    _train(model, opt, n=4)
    w.stop()
    assert _grown(twin, 1000) < 64_000  # after it
    assert not diagkit_hooks(twin)


def test_a_deep_copied_optimizer_carries_no_hook():
    model, opt, w, _ = _watched("optimizer")
    _train(model, opt)
    opt_copy = copy.deepcopy(opt)
    assert not opt_copy._optimizer_step_pre_hooks and not opt_copy._optimizer_step_post_hooks
    assert opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
    _train(model, opt, n=4)
    w.stop()
    assert not diagkit_hooks(model, [opt, opt_copy])
