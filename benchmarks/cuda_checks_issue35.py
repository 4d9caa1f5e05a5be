"""Issue 35's checks and figures for `cuda_check.py` (the runner: `Ctx`, the report, the order).

Checks (PASS/FAIL): items 1, 2, 5 and 5b of issue 35 on the device in its dtype (bf16 on CUDA),
the LoRA memory goal (item 3, exact mode) and the host-sync goals. Figures: the LoRA model's
extra device memory per delta mode (caching allocator), host syncs per observed / unobserved
step of a whole-run watch. Item 4 (torch.compile) is in cuda_checks_compile.py.
Each function takes the runner's `ctx` (device, dtype, quick, check/skip/info/figure).
"""

from __future__ import annotations

import gc
import traceback
import warnings
from pathlib import Path

import torch
from torch import nn

import diagkit

MiB = 2 ** 20
MODES = ("exact", "sampled", "off")
DIAGKIT_DIR = str(Path(diagkit.__file__).resolve().parent)


# ---------------------------------------------------------------------------- models, steps
def llama(ctx, *, vocab=64, hidden=16, inter=32, layers=2, heads=2, seed=0):
    """A randomly initialised Llama from its config, built on the device in ctx's dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, use_cache=False)
    torch.manual_seed(seed)
    with torch.device(ctx.device):
        model = LlamaForCausalLM(cfg)
    return model.to(ctx.dtype).train()


def lora(model, r=8):
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=r, target_modules=["q_proj", "v_proj"]))


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def tokens(ctx, vocab, batch, seq, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, seq), generator=g).to(ctx.device)


def lm_step(model, opt, x, syncs=None):
    """One training step; `syncs.phase` follows it (forward, backward, step)."""
    if syncs is not None:
        syncs.phase = "forward"
    loss = model(input_ids=x, labels=x).loss
    if syncs is not None:
        syncs.phase = "backward"
    if loss.requires_grad:  # nothing trains (item 5): the loop still steps its optimizer
        loss.backward()
    if syncs is not None:
        syncs.phase = "step"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def codes(diag) -> list[str]:
    return sorted(f"{f.severity}:{f.code}" for f in diag.findings)


def failure(diag) -> str:
    return "" if diag.failure is None else f" failure={diag.failure.error}"


def sync(ctx):
    if ctx.cuda:
        torch.cuda.synchronize()


def free(ctx):
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- items 1-5, 5b
def item1_lora_checkpointing(ctx):
    model = llama(ctx)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model = lora(model, r=4)
    opt = torch.optim.AdamW(trainable(model), lr=1e-3)
    w = diagkit.watch(model, opt, steps=4)
    for i in range(4):
        lm_step(model, opt, tokens(ctx, 64, 4, 12, seed=i))
    diag = w.diagnosis
    found = codes(diag)
    ctx.check("1 LoRA + reentrant checkpointing + enable_input_require_grads: no unregistered",
              diag.failure is None and not any(c.endswith(":unregistered") for c in found),
              f"findings={found}{failure(diag)}")


def item2_meta_optimizer(ctx):
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(ctx.dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # built on meta: holds meta tensors
    model.to_empty(device=ctx.device)
    for mod in model:
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    try:
        w = diagkit.watch(model, opt, steps=3)
    except Exception as exc:
        ctx.check("2 optimizer built on meta before to_empty(): watch() does not raise", False,
                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return
    x = torch.randn(8, 16, device=ctx.device, dtype=ctx.dtype)
    for _ in range(3):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    diag = w.diagnosis
    found = codes(diag)
    ctx.check("2 optimizer built on meta before to_empty(): watch() does not raise, orphans "
              "found", diag.failure is None and any(c.endswith(":orphan") for c in found),
              f"findings={found}{failure(diag)}")


def item5_nothing_trains(ctx):
    def frozen_lora():
        model = lora(llama(ctx), r=4)
        model.requires_grad_(False)  # PeftModel.from_pretrained(..., is_trainable=False)
        return model
    variants = {
        "every tensor frozen, optimizer over model.parameters()":
            lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
        "adapter not trainable, groups filtered empty":
            lambda m: torch.optim.AdamW([{"params": trainable(m)}], lr=1e-3),
    }
    for label, make_opt in variants.items():
        model = frozen_lora()
        opt = make_opt(model)
        w = diagkit.watch(model, opt, steps=2)
        for i in range(2):
            lm_step(model, opt, tokens(ctx, 64, 4, 12, seed=i))
        diag = w.diagnosis
        found = codes(diag)
        ctx.check(f"5 nothing trains ({label}): a nothing_trains error",
                  "error:nothing_trains" in found, f"findings={found}{failure(diag)}")


def item5b_one_step_lora(ctx):
    model = lora(llama(ctx), r=4)  # lora_B starts at zero: lora_A's first gradient is zero
    opt = torch.optim.AdamW(trainable(model), lr=1e-3)
    w = diagkit.watch(model, opt, steps=1)
    lm_step(model, opt, tokens(ctx, 64, 4, 12))
    diag = w.diagnosis
    found = codes(diag)
    ctx.check("5b 1-step LoRA watch: no zero_gradient warning",
              diag.failure is None and "warning:zero_gradient" not in found,
              f"findings={found}{failure(diag)}")


# ---------------------------------------------------------------------------- 3. memory
def lora_model(ctx):
    """Issue 35's LoRA model (r=8 on q/v of an 8-layer Llama, hidden 768, vocab 32000), or a
    small one with --quick; with its optimizer and a batch."""
    size = (dict(vocab=1000, hidden=64, inter=128, layers=2, heads=4) if ctx.quick else
            dict(vocab=32000, hidden=768, inter=2048, layers=8, heads=12))
    model = lora(llama(ctx, **size), r=8)
    opt = torch.optim.AdamW(trainable(model), lr=1e-4)
    x = tokens(ctx, size["vocab"], *((2, 16) if ctx.quick else (4, 128)))
    return model, opt, x


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def memory(ctx) -> int:
    """Device bytes the caching allocator has handed out (CPU: the resident set)."""
    return torch.cuda.memory_allocated() if ctx.cuda else rss()


def peak(ctx) -> int | None:
    return torch.cuda.max_memory_allocated() if ctx.cuda else None


def reset_peak(ctx):
    sync(ctx)
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()


def memory_figures(ctx):
    """Per delta mode: allocated before `watch`, after attaching, after 3 observed steps (still
    attached), after stop(); peak of the watched steps against a plain step's peak."""
    figures = {}
    for mode in MODES:
        model, opt, x = lora_model(ctx)
        for _ in range(2):  # optimizer state and .grad exist before anything is measured
            lm_step(model, opt, x)
        reset_peak(ctx)
        base = memory(ctx)
        for _ in range(3):
            lm_step(model, opt, x)
        sync(ctx)
        plain_peak = None if not ctx.cuda else peak(ctx) - base
        reset_peak(ctx)
        before = memory(ctx)
        w = diagkit.watch(model, opt, steps=1000, delta=mode)
        sync(ctx)
        attached = memory(ctx) - before
        for _ in range(3):
            lm_step(model, opt, x)
        sync(ctx)
        stepped = memory(ctx) - before
        watched_peak = None if not ctx.cuda else peak(ctx) - before
        diag = w.stop()
        sync(ctx)
        row = {"trained_bytes": nbytes(trainable(model)),
               "model_bytes": nbytes(model.parameters()),
               "extra_after_attach": attached, "extra_after_3_steps": stepped,
               "left_after_stop": memory(ctx) - before,
               "plain_step_peak_over_base": plain_peak,
               "watched_peak_over_base": watched_peak,
               "peak_extra": None if not ctx.cuda else watched_peak - plain_peak,
               "what": "torch.cuda.memory_allocated" if ctx.cuda else "RSS (not device memory)",
               "failure": None if diag is None or diag.failure is None else diag.failure.error}
        figures[mode] = row
        extra = max(stepped, row["peak_extra"] or 0)
        ctx.info(f"LoRA extra memory, delta={mode}: +{attached / MiB:.1f} MiB at attach, "
                 f"+{stepped / MiB:.1f} MiB after 3 steps, peak +"
                 f"{(row['peak_extra'] or 0) / MiB:.1f} MiB over a plain step's ({row['what']}); "
                 f"trained {row['trained_bytes'] / MiB:.2f} MiB of "
                 f"{row['model_bytes'] / MiB:.1f} MiB")
        if mode == "exact":
            goal = row["trained_bytes"] + 64 * MiB
            if ctx.cuda:
                ctx.check("3 LoRA extra device memory, exact: <= 1x trained bytes + 64 MiB",
                          extra <= goal, f"extra {extra / MiB:.1f} MiB, goal "
                                         f"{goal / MiB:.1f} MiB")
            else:
                ctx.skip("3 LoRA extra device memory, exact", "CUDA-only figure (the RSS "
                         f"above is informative: +{extra / MiB:.1f} MiB)")
        del model, opt, x, w, diag
        free(ctx)
    ctx.figure("lora_memory", figures)


def observed_steps(diag, n) -> list[bool]:
    """Which of a whole-run watch's `n` steps it observed (its steps table; the burst of 4
    first, then one in `every`)."""
    seen = set(int(s) for s in diag.steps["step"]) if len(diag.steps) else set()
    return [i in seen for i in range(n)]


# ---------------------------------------------------------------------------- host syncs
class Syncs:
    """Counts CUDA host synchronisations (`set_sync_debug_mode("warn")`) while inside, each
    with the phase of the step it came in and the innermost diagkit frame on its stack (the
    backward hooks run on autograd's device thread: the warnings filter is process-wide)."""

    def __init__(self):
        self.events, self.phase = [], ""

    def __enter__(self):
        torch.cuda.synchronize()
        self._cm = warnings.catch_warnings(record=True)
        self._cm.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._seen  # instead of the record: the stack says whose
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def _seen(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(DIAGKIT_DIR)]
        where = (f"{Path(ours[-1].filename).relative_to(DIAGKIT_DIR)}:{ours[-1].lineno} "
                 f"{ours[-1].name}") if ours else None
        self.events.append((self.phase, where))

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        self._cm.__exit__(*exc)

    def count(self, phases=("forward", "backward", "step"), diagkit_only=False):
        return sum(p in phases and (w is not None or not diagkit_only) for p, w in self.events)


def counted_steps(ctx, model, opt, x, n):
    rows = []
    for _ in range(n):
        with Syncs() as s:
            lm_step(model, opt, x, syncs=s)
            s.phase = "after"
        rows.append(s)
    return rows


def sync_figures(ctx):
    """Per delta mode, a whole-run watch (steps=None, every=2) of the LoRA model: the host syncs
    of each step (observed and unobserved), diagkit's by its stack, against plain steps."""
    if not ctx.cuda:
        ctx.skip("host syncs per observed / unobserved step", "CUDA-only figure "
                 "(torch.cuda.set_sync_debug_mode)")
        return
    figures = {}
    for mode in MODES:
        model, opt, x = lora_model(ctx)
        for _ in range(2):
            lm_step(model, opt, x)
        plain = counted_steps(ctx, model, opt, x, 2)
        w = diagkit.watch(model, opt, steps=None, every=2, delta=mode)
        watched = counted_steps(ctx, model, opt, x, 12)  # a burst of 4, then one in 2
        diag = w.stop()
        observed = observed_steps(diag, len(watched))
        hooks = [s.count(("forward", "backward"), diagkit_only=True) for s in watched]
        ours = [s.count(diagkit_only=True) for s in watched]
        figures[mode] = {
            "plain_step_syncs": [s.count() for s in plain],
            "watched_step_syncs": [s.count() for s in watched],
            "diagkit_syncs_per_step": ours, "diagkit_syncs_in_forward_backward": hooks,
            "observed": observed,
            "where": sorted({w for s in watched for _, w in s.events if w}),
            "after_step_syncs": [s.count(("after",)) for s in watched]}
        obs = [n for n, o in zip(ours, observed) if o]
        unobs = [n for n, o in zip(ours, observed) if not o]
        detail = (f"diagkit's per step {ours} (observed {observed}), all syncs per watched step "
                  f"{figures[mode]['watched_step_syncs']} vs plain "
                  f"{figures[mode]['plain_step_syncs']}; at {figures[mode]['where']}")
        ctx.check(f"host syncs, delta={mode}: 0 in hooks, <= 1 per observed step, 0 per "
                  "unobserved step", sum(hooks) == 0 and max(obs, default=0) <= 1
                  and max(unobs, default=0) == 0, detail)
        del model, opt, x, w, diag
        free(ctx)
    ctx.figure("host_syncs", figures)


SECTIONS = [  # (name, function, seconds it needs at least)
    ("1 LoRA + checkpointing", item1_lora_checkpointing, 10),
    ("2 meta optimizer", item2_meta_optimizer, 5),
    ("5 nothing trains", item5_nothing_trains, 10),
    ("5b 1-step LoRA", item5b_one_step_lora, 5),
    ("3 LoRA memory", memory_figures, 25),
    ("host syncs", sync_figures, 25),
]
