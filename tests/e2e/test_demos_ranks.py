"""The rank demos (diagkit.demos.ranks), meta_memory under real DDP, and ranks.rank_view.

Single process: each rank demo gives its single-process verdict. Two processes: this file, run
as a script, is the per-rank worker (gloo on CPU, no diagkit launcher): it builds the demos under
a real process group and writes what it saw to a JSON file, which the tests compare across ranks.
"""

from __future__ import annotations

import html
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import diagkit
from diagkit.demos import DEMOS, common
from diagkit.judge.rules_ranks import rank_dependent_use, rank_divergent
from diagkit.present.ranks import rank_view

MEM = "module.metamodel.model.mem_tokens"
FREE = "<optimizer 0 group 1 #0>"
HOSTILE = "<script>alert(1)</script>"
BODY = ["module.body.weight", "module.body.bias", "module.head.weight", "module.head.bias"]
WORKER_TIMEOUT_S = 60


# ------------------------------------------------------------------ single process
def diagnose(name: str, **kwargs):
    return diagkit.diagnose(diagkit.load_target(f"diagkit.demos:{name}", **kwargs))


def test_rank_demos_are_exported_but_not_in_diagkit_demo():
    import diagkit.demos as demos
    for name in ("forward_arg", "rank_branch", "ddp_strict", "hang", "crash"):
        assert name in demos.__all__ and callable(getattr(demos, name))
        assert name not in DEMOS
    assert DEMOS == ("meta_memory", "finetune_heads", "clean")


def test_wrap_like_ddp_without_a_process_group():
    assert not torch.distributed.is_initialized()
    assert not common.distributed() and common.current_rank() == 0
    wrapped = common.wrap_like_ddp(torch.nn.Linear(2, 2), find_unused_parameters=True)
    assert type(wrapped) is common.WrapperLikeDDP
    assert [n for n, _ in wrapped.named_parameters()] == ["module.weight", "module.bias"]
    assert type(diagkit.load_target("diagkit.demos:meta_memory").model) is common.WrapperLikeDDP


def test_forward_arg_single_process_not_in_model():
    diag = diagnose("forward_arg")
    assert diag.meta["steps_observed"] == 3
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, FREE: {"not_in_model"}}
    row = diag.params.set_index("name").loc[FREE]
    assert not row["in_model"] and row["used_steps"] == 3 and row["changed_steps"] == 3


def test_rank_branch_single_process_branch_unused():
    diag = diagnose("rank_branch")
    aux = {"module.aux.weight", "module.aux.bias"}
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, **{n: {"unused"} for n in aux}}


def test_ddp_strict_single_process_head_unused():
    diag = diagnose("ddp_strict")
    head = {"module.old_head.weight", "module.old_head.bias"}
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, **{n: {"unused"} for n in head}}
    assert diag.advice["find_unused_parameters"]["value"] is True


@pytest.mark.parametrize("name", ["hang", "crash"])
def test_hang_and_crash_never_fault_in_one_process(name):
    diag = diagnose(name)
    assert diag.failure is None and diag.meta["steps_observed"] == 3
    assert diag.verdicts() == {n: {"ok"} for n in BODY}


def test_crash_at_step_zero_still_single_process_safe():
    diag = diagnose("crash", crash_at=0, steps=2)
    assert diag.failure is None and diag.meta["steps_observed"] == 2


def test_rank_demos_are_deterministic():
    a, b = (diagkit.load_target("diagkit.demos:forward_arg") for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    for _ in range(2):
        (xa, ya), (xb, yb) = a.batch_fn(), b.batch_fn()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    c = diagkit.load_target("diagkit.demos:forward_arg", seed=1)
    assert not torch.equal(c.batch_fn()[0], diagkit.load_target(
        "diagkit.demos:forward_arg").batch_fn()[0])


def test_single_process_rank_view_is_empty():
    assert rank_view(diagnose("clean", steps=1)) == ""  # the report folds the section away


# ------------------------------------------------------------------ two processes (gloo)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Run this file as the worker on 2 gloo ranks; each rank's observations, by rank."""
    out = tmp_path_factory.mktemp("ranks")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, str(out / f"rank{r}.json")],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs, deadline = [], time.monotonic() + WORKER_TIMEOUT_S
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                pytest.fail(f"2-process worker ran past {WORKER_TIMEOUT_S} s (killed)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    from jobs import finished  # here: this file is also the ranks' script, run from e2e/
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert finished(p.returncode, log), f"rank {r} exited {p.returncode}:\n{log[-3000:]}"
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert res["errors"] == {}, f"rank {r}: {res['errors']}"
    return results


def test_ranks_saw_a_real_process_group(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 for r in ranks)
    # batches are seeded with the rank: they differ between ranks
    assert ranks[0]["first_batch"] != ranks[1]["first_batch"]


def test_meta_memory_under_ddp_still_drops_mem_tokens(ranks):
    for r in ranks:
        m = r["meta_memory"]
        assert m["model_type"] == "DistributedDataParallel"
        assert MEM in m["trainable"] and MEM not in m["held"]
        assert sorted(m["held"]) == sorted(n for n in m["trainable"] if n != MEM)
        assert len(m["held"]) == 8
        assert m["steps_ran"] == 2 and m["mem_grad_norm"] > 0
    # DDP averaged mem_tokens' gradient: the same on both ranks
    assert ranks[0]["meta_memory"]["mem_grad_norm"] == ranks[1]["meta_memory"]["mem_grad_norm"]


def test_forward_arg_diverges_between_ranks(ranks):
    a, b = (r["forward_arg"] for r in ranks)
    assert a["free_before"] == b["free_before"]
    assert a["free"] != b["free"], "the forward-argument tensor should drift apart"
    assert a["model"] == b["model"], "DDP keeps the registered parameters in sync"


def test_rank_branch_autograd_reaches_the_branch_on_rank_1_only(ranks):
    a, b = (r["rank_branch"] for r in ranks)
    assert a["accumulated"] == {"module.aux.weight": 0, "module.aux.bias": 0}
    assert b["accumulated"] == {"module.aux.weight": 2, "module.aux.bias": 2}
    assert a["body_accumulated"] == b["body_accumulated"] == 2
    # DDP still writes the averaged gradient into rank 0's .grad of the locally unused branch:
    # a `.grad is not None` test would call it used; only autograd's accumulation tells.
    assert a["aux_grad"] == b["aux_grad"] and a["aux_grad"] is not None
    assert a["aux"] == b["aux"], "rank-dependent use, yet the values stay in sync"


def test_ddp_strict_raises_on_the_second_step(ranks):
    for r in ranks:
        s = r["ddp_strict"]
        assert s["steps_ran"] == 1
        assert "Expected to have finished reduction in the prior iteration" in s["error"]


def test_crash_raises_on_rank_1_only(ranks):
    assert ranks[0]["crash"] == {"calls_ok": 2, "error": None}
    assert ranks[1]["crash"] == {"calls_ok": 1, "error": "rank 1 crashed on purpose"}


def test_hang_sleeps_on_rank_1_only(ranks):
    assert ranks[0]["hang"] == {"step0_returned": True, "step1_returned": True}
    assert ranks[1]["hang"] == {"step0_returned": True, "step1_returned": False}


# ------------------------------------------------------------------ rank_view
def rank_steps(spec: dict, n_steps: int = 3, n_ranks: int = 2) -> pd.DataFrame:
    """steps rows for every (step, rank, tensor); spec: name -> (used(step, rank),
    checksum(step, rank))."""
    rows = [{"step": s, "name": name, "rank": r, "used": bool(used(s, r)),
             "checksum": float(checksum(s, r)), "grad_norm": 1.0}
            for s in range(n_steps) for r in range(n_ranks)
            for name, (used, checksum) in spec.items()]
    return pd.DataFrame(rows)


def _body(out: str) -> list[str]:
    return out.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]


def test_rank_view_names_ranks_steps_and_first_divergence():
    steps = rank_steps({
        "enc.weight": (lambda s, r: True, lambda s, r: 1.0),                       # in sync
        "aux.weight": (lambda s, r: r == 1, lambda s, r: 2.0),                     # rank 1 only
        "scale": (lambda s, r: True, lambda s, r: 4.0 + (r if s >= 1 else 0)),     # from step 1
        HOSTILE: (lambda s, r: r == 0 and s != 1, lambda s, r: 1.0 + s * r),       # both
    })
    out = rank_view(steps)
    assert "2 ranks (0–1), 3 steps observed; 3 tensors differ between ranks" in out
    assert "(2 used on some ranks only, 2 with values that diverged)" in out
    rows = _body(out)
    assert len(rows) == 3 and "enc.weight" not in out
    # diverged first, earliest first (the hostile name after step 1, spread 2/3; scale step 1)
    hostile = html.escape(HOSTILE)
    assert hostile in rows[0] and "scale" in rows[1] and "aux.weight" in rows[2]
    assert HOSTILE not in out and "<script" not in out
    assert "rank 0: steps 0, 2; rank 1: never" in rows[0]
    assert "after step 1" in rows[0] and ">0.667<" in rows[0]
    assert "ranks 0–1: steps 0–2" in rows[1] and "after step 1" in rows[1]
    assert ">0.2<" in rows[1]  # (5 - 4) / 5
    assert "rank 1: steps 0–2; rank 0: never" in rows[2]
    assert rows[2].count("—") == 2  # never diverged: no step, no spread


def test_rank_view_agrees_with_the_rank_verdicts():
    steps = rank_steps({f"p{i}": (lambda s, r, i=i: r == 0 or i % 3 == 0,
                                  lambda s, r, i=i: i + (r * s if i % 4 == 0 else 0))
                        for i in range(24)}, n_steps=4, n_ranks=3)
    params = pd.DataFrame({"name": [f"p{i}" for i in range(24)]})
    expected = set(params["name"][rank_divergent(params, steps) | rank_dependent_use(params, steps)])
    out = rank_view(steps)
    shown = {name for name in params["name"] if f"<code>{name}</code>" in out}
    assert shown == expected and len(expected) == 18
    assert "3 ranks (0–2), 4 steps observed; 18 tensors differ" in out


def test_rank_view_nan_on_one_rank_counts_as_divergence():
    steps = rank_steps({"w": (lambda s, r: True, lambda s, r: np.nan if r == 1 and s == 2 else 1)})
    out = rank_view(steps)
    assert "after step 2" in out and ">inf<" in out


def test_rank_view_without_checksum_and_in_sync():
    steps = rank_steps({"w": (lambda s, r: True, lambda s, r: 1.0)})
    assert "no tensor differs between ranks" in rank_view(steps)
    assert "<table" not in rank_view(steps)
    out = rank_view(rank_steps({"w": (lambda s, r: s == r, lambda s, r: 0.0)})
                           .drop(columns="checksum"))
    assert "1 tensor differs between ranks" in out and "rank 0: step 0; rank 1: step 1" in out


def test_rank_view_is_bounded_at_2000_tensors():
    steps = rank_steps({f"layer.{i}.weight": (lambda s, r, i=i: r == 0 or i % 2 == 0,
                                              lambda s, r, i=i: 1.0 + (r * s * i if i % 5 == 0
                                                                       else 0))
                        for i in range(2000)}, n_steps=5)
    out = rank_view(steps)
    # odd: used on rank 0 only; non-zero multiples of 5: diverged after step 1
    flagged = sum(1 for i in range(2000) if i % 2 or (i % 5 == 0 and i))
    rows = _body(out)
    assert len(rows) == 50
    n = int(out.rsplit("and ", 1)[1].split(" more")[0])
    total = int(out.split("observed; ")[1].split(" tensors")[0])
    assert total == n + 50 == flagged == 1199 and len(out) < 30_000
    assert all('class="error"' in row for row in rows)  # diverged ones first


# ------------------------------------------------------------------ the worker (per rank)
def _standard_steps(setup: dict, n: int) -> int:
    model, opt = setup["model"], setup["optimizer"]
    done = 0
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        setup["loss_fn"](model, setup["batch_fn"]()).backward()
        opt.step()
        done += 1
    return done


def _values(tensors) -> list[float]:
    return [float(x) for t in tensors for x in t.detach().flatten().tolist()]


def _meta_memory() -> dict:
    from diagkit.demos import meta_memory
    setup = meta_memory()
    model = setup["model"]
    names = {id(p): n for n, p in model.named_parameters()}
    held = [names.get(id(p), "?") for g in setup["optimizer"].param_groups for p in g["params"]]
    ran = _standard_steps(setup, 2)
    mem = dict(model.named_parameters())[MEM]
    return {"model_type": type(model).__name__, "held": held,
            "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
            "steps_ran": ran, "mem_grad_norm": float(mem.grad.norm())}


def _forward_arg() -> dict:
    from diagkit.demos import forward_arg
    setup = forward_arg()
    free = setup["optimizer"].param_groups[1]["params"]
    before = _values(free)
    _standard_steps(setup, 2)
    return {"free_before": before, "free": _values(free),
            "model": _values(setup["model"].parameters())}


def _rank_branch() -> dict:
    from diagkit.demos import rank_branch
    setup = rank_branch()
    model = setup["model"]
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():
        counts[name] = 0
        p.register_post_accumulate_grad_hook(
            lambda _p, name=name: counts.__setitem__(name, counts[name] + 1))
    _standard_steps(setup, 2)
    aux = [p for n, p in model.named_parameters() if n.startswith("module.aux.")]
    return {"accumulated": {n: c for n, c in counts.items() if n.startswith("module.aux.")},
            "body_accumulated": counts["module.body.weight"],
            "aux_grad": _values(p.grad for p in aux) if all(p.grad is not None for p in aux)
            else None,
            "aux": _values(aux)}


def _crash() -> dict:
    from diagkit.demos import crash
    setup = crash()
    calls_ok, error = 0, None
    with torch.no_grad():  # no backward: a raising rank leaves no peer waiting in a collective
        for _ in range(2):
            try:
                setup["loss_fn"](setup["model"], setup["batch_fn"]())
                calls_ok += 1
            except RuntimeError as exc:
                error = str(exc)
                break
    return {"calls_ok": calls_ok, "error": error}


def _hang() -> dict:
    from diagkit.demos import hang
    setup = hang()
    returned = {}
    for step in range(2):
        batch = setup["batch_fn"]()

        def call():
            with torch.no_grad():
                setup["loss_fn"](setup["model"], batch)
            returned[step] = True

        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(timeout=1.0 if step else 10.0)
        if t.is_alive():
            break
    return {"step0_returned": 0 in returned, "step1_returned": 1 in returned}


def _ddp_strict() -> dict:
    from diagkit.demos import ddp_strict
    setup = ddp_strict()
    ran, error = 0, None
    try:
        for _ in range(2):
            ran += _standard_steps(setup, 1)
    except RuntimeError as exc:
        error = str(exc)
    return {"steps_ran": ran, "error": error}


def worker(out_path: str) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {"rank": rank, "world_size": dist.get_world_size(), "errors": {}}
    torch.manual_seed(0)
    from diagkit.demos.ranks import _rank_batches
    result["first_batch"] = _values(_rank_batches(0, 2)())
    # ddp_strict last: its failed reduction may leave DDP state behind
    for name, check in [("meta_memory", _meta_memory), ("forward_arg", _forward_arg),
                        ("rank_branch", _rank_branch), ("crash", _crash), ("hang", _hang),
                        ("ddp_strict", _ddp_strict)]:
        try:
            result[name] = check()
        except Exception as exc:  # reported by the tests, with the other checks' results
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
        dist.barrier()
    Path(out_path).write_text(json.dumps(result))
    # rank 1 may still have hang's sleeping daemon thread: leave without waiting for it
    os._exit(0)


if __name__ == "__main__":
    worker(sys.argv[1])
