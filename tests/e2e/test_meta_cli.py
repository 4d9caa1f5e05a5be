"""`diagkit check TARGET --meta` from the command line: a LLaMA model with a peft LoRA wrapper
built after its optimizer (the optimizer-before-wrap bug), tiny and at 70B, and the one-line
refusals of what a dry run cannot do (docs/meta.md, "Dry run on meta"). The command runs in
this process (tests/helpers/cli_inprocess.py), but for the real console script in a subprocess (the
`--nproc 2` refusal of test_what_a_dry_run_cannot_do_is_one_line_exit_2) and the 70B run,
whose peak memory is its own process's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli_inprocess import run_cli

pytest.importorskip("transformers")
pytest.importorskip("peft")

DIAGKIT = Path(sys.executable).parent / "diagkit"
TARGET = "diagkit.demos.llama_lora:llama_lora"


def check(*args):
    return run_cli("check", *args)


def check_console_script(*args, timeout=300):
    """The real console script, in a subprocess."""
    return subprocess.run([str(DIAGKIT), "check", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_tiny_llama_lora_optimizer_before_wrap(tmp_path):
    out = tmp_path / "run.json"
    run = check(TARGET, "--meta", "--arg", "size=tiny", "--json", str(out))
    assert run.returncode == 1, run.stderr  # the orphans are errors
    text = " ".join(run.stdout.split())
    assert "one meta pass (no values)" in text and "not measured on meta" in text
    payload = json.loads(out.read_text())
    verdicts = {p["name"]: set(p["verdicts"]) for p in payload["params"]}
    lora = {n for n in verdicts if ".lora_" in n}
    base = {n for n in verdicts if n.endswith(("q_proj.base_layer.weight", "mlp.up_proj.weight"))}
    assert len(lora) == 8 and all(verdicts[n] == {"orphan"} for n in lora)
    assert len(base) == 4 and all(verdicts[n] == {"frozen_in_optimizer"} for n in base)
    assert all(p["device"] == "meta" for p in payload["params"])
    assert "stalled" in payload["meta"]["not_measured"]
    assert payload["advice"]["find_unused_parameters"]["value"] is False


# A file target whose model names a real device: building it under torch.device("meta")
# leaves it on cpu, which the dry run refuses rather than moving it.
REAL = textwrap.dedent('''
    import torch

    def build():
        model = torch.nn.Linear(3, 3, device="cpu")
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": lambda: torch.ones(2, 3), "loss_fn": lambda m, b: m(b).sum()}
''')


@pytest.mark.parametrize("extra, words", [
    (["--nproc", "2"], "--meta is a dry run in this process: it cannot be combined with "
                       "--nproc 2"),
    (["--checkpoint", "x.pt"], "a meta tensor holds no values, so no checkpoint can be loaded"),
    ("real", "needs a model built on the meta device, but 2 of its 2 tensors are on cpu"),
])
def test_what_a_dry_run_cannot_do_is_one_line_exit_2(tmp_path, extra, words):
    if extra == "real":
        (tmp_path / "real.py").write_text(REAL)
        run = check(f"{tmp_path / 'real.py'}:build", "--meta")
    elif "--nproc" in extra:  # refused before anything is built: the cheapest real process
        run = check_console_script(TARGET, "--meta", "--arg", "size=tiny", *extra)
    else:
        run = check(TARGET, "--meta", "--arg", "size=tiny", *extra)
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = [line for line in run.stderr.splitlines() if line.startswith("diagkit:")]
    assert len(lines) == 1 and words in lines[0], run.stderr
    assert "Traceback" not in run.stderr


MEASURED = textwrap.dedent('''
    import resource, sys
    from diagkit.run.cli.commands import main
    code = main(sys.argv[1:])
    print("MAXRSS_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          file=sys.stderr)
    sys.exit(code)
''')


def test_the_70b_llama_lora_dry_run(tmp_path):
    """70.6B parameters (263 GiB in float32) in well under a minute and under 1.5 GiB of peak
    RSS (docs/meta.md records 5.7 s and 461 MiB on this machine)."""
    out = tmp_path / "run.json"
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", MEASURED, "check", TARGET, "--meta", "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - started
    assert run.returncode == 1, run.stderr
    rss = float(run.stderr.split("MAXRSS_MIB")[1].split()[0])
    payload = json.loads(out.read_text())
    total = sum(p["numel"] for p in payload["params"])
    assert 70e9 < total < 71e9
    assert rss < 1536, rss
    assert seconds < 120, seconds
    orphans = [p for p in payload["params"] if "orphan" in p["verdicts"]]
    frozen = [p for p in payload["params"] if "frozen_in_optimizer" in p["verdicts"]]
    assert len(orphans) == 320 and all(".lora_" in p["name"] for p in orphans)
    assert sum(p["bytes"] for p in frozen) > 250 * 2**30


def test_the_report_says_what_was_not_measured(tmp_path):
    """`diagkit report --meta`: the notebook's `meta` parameter, the banner's line, the JSON."""
    run = run_cli("report", TARGET, "--meta", "--arg", "size=tiny", "--out", tmp_path / "r")
    assert run.returncode == 1, run.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Dry run on the meta device" in page and "stalled (needs values)" in page
    found = json.loads((tmp_path / "r" / "findings.json").read_text())
    assert found["meta"]["device"] == "meta" and "zero_gradient" in found["meta"]["not_measured"]
    assert {f["code"] for f in found["findings"]} >= {"orphan", "frozen_in_optimizer"}


SLOW = textwrap.dedent('''
    import time, torch

    def build():
        model = torch.nn.Linear(3, 3)

        def loss_fn(m, b):
            time.sleep(60)
            return m(b).sum()
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": lambda: torch.ones(2, 3), "loss_fn": loss_fn}
''')


def test_timeout_bounds_the_meta_pass(tmp_path):
    # The clock starts when the target begins to import, so the bound must leave room for
    # building the meta setup on a loaded CI machine (3 s did not); the step sleeps 60 s.
    (tmp_path / "slow.py").write_text(SLOW)
    run = check(f"{tmp_path / 'slow.py'}:build", "--meta", "--timeout", "20")
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "diagkit: error: timed out after 20 s (--timeout) in step 0, in its meta pass; the 0 "
        "steps completed before it are kept")
