"""A whole-run watch saves as it goes (docs/whole-run.md, "The whole run"): a run killed outright
(SIGKILL, as pre-emption ends a job) keeps everything up to its last save, and `diagkit report
--from` renders that run while it is still going."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import diagkit
from jobs import marked

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = '''
import sys, time
import torch, diagkit
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
model[0].requires_grad_(False)
opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
w = diagkit.watch(model, opt, steps=None, every=5, out=sys.argv[1])
x = torch.ones(3, 4)
for step in range(40):
    if step == 20:
        model[0].requires_grad_(True)  # unfrozen, never added to the optimizer
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
print("trained", flush=True)
time.sleep(300)  # still going when it is killed
'''


def test_a_killed_run_keeps_its_last_save_and_renders_while_going(tmp_path):
    script, out = tmp_path / "train.py", tmp_path / "diag"
    script.write_text(SCRIPT)
    with marked({**os.environ, "PYTHONPATH": str(ROOT / "src")}) as env:
        proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "trained", proc.stderr.read()
            report = subprocess.run([str(Path(sys.executable).with_name("diagkit")), "report", "--from",
                                     str(out), "--out", str(tmp_path / "report")], env=env,
                                    capture_output=True, text=True, timeout=300)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    diag = diagkit.load(out)
    assert diag.meta["ended"] == "running"
    assert [e["step"] for e in diag.meta["events"]] == [20]
    (orphan,) = [f for f in diag.findings if f.code == "orphan"]
    assert (orphan.module, orphan.since) == ("0", 21)
    assert report.returncode == 1, report.stderr  # an error finding: exit 1
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Findings over the run" in page or "Over the run" in page
    assert "step 20: 0.weight, 0.bias became trainable" in page
