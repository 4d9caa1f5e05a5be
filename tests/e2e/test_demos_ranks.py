"""The rank demos (diagkit.demos.ranks) and meta_memory under real DDP, in two processes.

This file, run as a script, is the per-rank worker (gloo on CPU, no diagkit launcher): it
builds the demos under a real process group and writes what it saw to a JSON file, which the
tests compare across ranks (one job for the module). The same demos in one process are
test_demos_ranks_one_process.py; the rank view of a report, test_rank_view.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

MEM = "module.metamodel.model.mem_tokens"
WORKER_TIMEOUT_S = 60


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
    from jobs import finished  # here: this file is also the ranks' script, where jobs is not found
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
