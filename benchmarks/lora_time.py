"""O. A LoRA fine-tune (issue 35, item 3): r=8 on q_proj/v_proj (peft) of an 8-layer Llama
(hidden 768, vocab 32000, intermediate 2048, random init from a LlamaConfig, no network).

- Memory: peak RSS (VmHWM) of a fresh process per variant: plain steps, then `diagkit.watch`
  in each `delta` mode over the same steps; extra = the variant's peak minus the plain one's
  (imports done before the warm-up, so they weigh on neither). Goal: <= 1x the bytes of what
  trains + 64 MiB.
- Time: `diagkit.watch` in the user's loop against plain steps, interleaved per round (plain,
  watched, and a second plain block: the A/A control), the order alternating between rounds;
  a watched block's first and last steps (set-up, judging) are left out, as in F, and reported
  apart: its edges, where the frozen base is read (at attach, and at the end with the judging;
  docs/cost.md, "When the frozen base is read"), with one read of the base timed alone.
- The 70B plan: LLaMA-70B's shape on meta with LoRA on q/v and an optimizer of what trains:
  the snapshot bytes exact mode would allocate (`split_probe.split`, values=False).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

SIZE = dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=12,
            num_key_value_heads=12, intermediate_size=2048, vocab_size=32000)
QUICK = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, intermediate_size=128, vocab_size=512)
BATCH, SEQ = 1, 64
VARIANTS = ("plain", "exact", "sampled", "off")
MiB = 1 << 20


def build(size: dict):
    """(model, optimizer, step): the LoRA model, AdamW over what trains, one training step."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**size))
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    gen = torch.Generator().manual_seed(1)

    def step(_i=0):
        ids = torch.randint(0, size["vocab_size"], (BATCH, SEQ), generator=gen)
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return model, opt, step


def facts(model) -> dict:
    params = list(model.parameters())
    return {"param_bytes": sum(p.nbytes for p in params),
            "trained_bytes": sum(p.nbytes for p in params if p.requires_grad)}


def _hwm() -> int:
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM")][0]


def memory_child(variant: str, size: dict, steps: int) -> dict:
    """In a fresh process: build, imports, 2 warm-up steps, then `steps` steps plain or
    watched in `variant`'s mode; the peak RSS before and after."""
    import torch
    torch.set_num_threads(1)
    import diagkit
    import diagkit.run.watch.watch  # noqa: F401 (imports are not the watch's memory)
    import pandas  # noqa: F401
    model, opt, step = build(size)
    for i in range(2):
        step(i)
    before = _hwm()
    if variant != "plain":
        w = diagkit.watch(model, opt, steps=steps, delta=variant)
    for i in range(steps):
        step(i)
    if variant != "plain":
        assert w.diagnosis is not None
    return {"variant": variant, "peak": _hwm(), "warm_peak": before, **facts(model)}


def lora_memory(quick: bool = False, steps: int = 3) -> dict:
    """Peak RSS per variant, one fresh process each, run one after another."""
    size = QUICK if quick else SIZE
    out = {}
    for variant in VARIANTS:
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(
            {"variant": variant, "size": size, "steps": steps})], capture_output=True,
            text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"lora memory child {variant} failed:\n{done.stderr[-3000:]}")
        out[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    for variant in VARIANTS[1:]:
        out[variant]["extra_bytes"] = out[variant]["peak"] - out["plain"]["peak"]
    return out


def time_lora(quick: bool = False, rounds: int = 3, k: int = 3) -> dict:
    """Watched (exact) against plain steps, interleaved, with an A/A control."""
    import torch
    torch.set_num_threads(1)
    import diagkit
    from diagkit.measure.model.restore import SavedState
    model, opt, step = build(QUICK if quick else SIZE)
    for i in range(2):
        step(i)
    saved = SavedState(model, [p for p in model.parameters() if p.requires_grad], [opt])

    def block(n: int) -> list[float]:
        times = []
        for i in range(n):
            s = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - s)
        return times

    got = {"plain": [], "watch": [], "aa": [], "first": [], "last": [], "attach": []}
    ratios, aa = [], []
    for r in range(rounds):
        this = {}
        for name in (["plain", "watch", "aa"] if r % 2 == 0 else ["aa", "watch", "plain"]):
            if name == "watch":
                s = time.perf_counter()
                w = diagkit.watch(model, opt, steps=k + 2)
                got["attach"].append(time.perf_counter() - s)
                times = block(k + 2)
                this[name] = times[1:-1]  # not the set-up, not the judging
                got["first"].append(times[0])
                got["last"].append(times[-1])  # the end read of the base, the judging
                assert w.done
            else:
                this[name] = block(k)
            saved.restore()
        for name, times in this.items():
            got[name] += times
        ratios.append(statistics.median(this["watch"]) / statistics.median(this["plain"]))
        aa.append(statistics.median(this["aa"]) / statistics.median(this["plain"]))
    med = statistics.median
    return {"rounds": rounds, "steps_per_block": k, "plain_step_s": med(got["plain"]),
            "attach_s": med(got["attach"]), "first_step_s": med(got["first"]),
            "last_step_s": med(got["last"]), "base_read_s": base_read(model),
            "watched_step_s": med(got["watch"]),
            "ratio_of_medians": med(got["watch"]) / med(got["plain"]),
            "median_of_round_ratios": med(ratios), "aa_ratio": med(got["aa"]) / med(got["plain"]),
            "round_ratios": ratios, "aa_round_ratios": aa, **facts(model)}


def base_read(model, rounds: int = 3) -> float:
    """One read of the frozen base (what no optimizer holds, not requiring grad: the
    watch's), timed alone: the median of `rounds` (`split_probe.FrozenWindow`)."""
    from diagkit.measure.change.split_probe import FrozenWindow
    frozen = [p for p in model.parameters() if not p.requires_grad]
    times = []
    for _ in range(rounds):
        window = FrozenWindow(frozen, range(len(frozen)))
        window.open()
        times.append(window.seconds)
    return statistics.median(times)


def plan_70b() -> dict:
    """The snapshot bytes exact mode would allocate for LLaMA-70B + LoRA (r=8, q/v), counted
    on meta, against the bytes of what trains and of the whole model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from diagkit.demos.llama_lora import SIZES
    from diagkit.measure.change import split_probe
    from diagkit.measure.model.inventory import take_inventory
    with torch.device("meta"):
        base = LlamaForCausalLM(LlamaConfig(**SIZES["70b"], tie_word_embeddings=False))
        model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    inv = take_inventory(model, [torch.optim.AdamW(trainable, lr=1e-4)])
    held = {int(k) for ks in inv.held_by(1) for k in ks}
    frozen = {k for k, t in enumerate(inv.tensors) if not t.requires_grad and k not in held}
    plan = split_probe.split(inv.tensors, frozen, values=False)
    every = range(len(inv.tensors))
    return {"planned_bytes": split_probe.snapshot_bytes(inv.tensors, plan.snapshot),
            "before_bytes": split_probe.snapshot_bytes(inv.tensors, every),
            "trained_bytes": sum(p.numel() * p.element_size() for p in trainable),
            "fingerprinted": len(plan.prints), "snapshotted": len(plan.snapshot)}


def lora_lines(r: dict, goal_mib: float) -> list[tuple]:
    """The table rows (measure, measured, goal, status) of section O."""
    lines = []
    mem = r.get("memory")
    if mem:
        trained = mem["plain"]["trained_bytes"]
        goal = trained + goal_mib * MiB
        for variant in VARIANTS[1:]:
            extra = mem[variant]["extra_bytes"]
            lines.append((f"extra peak RSS, LoRA Llama, watch delta={variant}",
                          f"{extra / MiB:.1f} MiB (params {mem['plain']['param_bytes'] / MiB:.0f}"
                          f" MiB, trained {trained / MiB:.2f} MiB; plain peak "
                          f"{mem['plain']['peak'] / MiB:.0f} MiB, VmHWM)",
                          f"<= trained + {goal_mib:.0f} MiB" if variant == "exact" else "-",
                          ("met" if extra <= goal else "NOT met") if variant == "exact" else "-"))
    t = r.get("time")
    if t:
        ratio = t["ratio_of_medians"]
        lines.append(("step time watched/plain, LoRA Llama, delta=exact",
                      f"{ratio:.3f}x (plain {1e3 * t['plain_step_s']:.0f} ms, "
                      f"watched {1e3 * t['watched_step_s']:.0f} ms; per-round median "
                      f"{t['median_of_round_ratios']:.3f}x; A/A control {t['aa_ratio']:.3f}x)",
                      "<= 1.05x", "met" if ratio <= 1.05 else "NOT met"))
        if "base_read_s" in t:
            lines.append(("  the watch's edges: attach; first step; last step (judging)",
                          f"{1e3 * t['attach_s']:.0f} ms; {1e3 * t['first_step_s']:.0f} ms; "
                          f"{1e3 * t['last_step_s']:.0f} ms (one read of the frozen base "
                          f"alone: {1e3 * t['base_read_s']:.0f} ms, twice a watch)", "-", "-"))
    p = r.get("plan_70b")
    if p:
        goal = p["trained_bytes"] + goal_mib * MiB
        lines.append(("snapshot bytes planned, LLaMA-70B + LoRA on meta, delta=exact",
                      f"{p['planned_bytes'] / MiB:.1f} MiB (trained {p['trained_bytes'] / MiB:.1f}"
                      f" MiB; before: {p['before_bytes'] / 2**30:.0f} GiB; "
                      f"{p['fingerprinted']} tensors fingerprinted)",
                      f"<= trained + {goal_mib:.0f} MiB",
                      "met" if p["planned_bytes"] <= goal else "NOT met"))
    return lines


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    spec = json.loads(sys.argv[2])
    print(json.dumps(memory_child(spec["variant"], spec["size"], spec["steps"])))
