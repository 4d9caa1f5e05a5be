"""The frameworks are optional extras: diagkit, its command line and the integrations package
itself import none of them; only `diagkit.integrations.<framework>` does, when it is used."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "accelerate", "peft",
              "wandb", "tensorboard", "mlflow", "trackio")  # the trackers: report_to's extras


def loaded_after(statement: str) -> list[str]:
    code = (f"import sys; {statement}; "
            f"print(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [m for m in done.stdout.strip().split(",") if m]


def test_diagkit_and_the_integrations_package_import_no_framework():
    assert loaded_after("import diagkit, diagkit.integrations, diagkit.run.cli.commands, "
                        "diagkit.run.watch.watch") == []


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("lightning", "pytorch_lightning")),
                    reason="needs both Lightning packages")
def test_each_integration_imports_its_own_framework_only():
    assert "pytorch_lightning" not in loaded_after("import diagkit.integrations.lightning")
    assert "lightning" not in loaded_after("import diagkit.integrations.pytorch_lightning")


def test_the_70b_demo_without_peft_names_the_extra_to_install():
    """From a wheel without the extras, the 70B `--meta` command of docs/meta.md ends in one
    line that says what to install (it was "No module named 'peft'"), exit code 2."""
    code = ("import sys; sys.modules['peft'] = None; "  # an import of peft now fails
            "from diagkit.run.cli.commands import main; "
            "sys.exit(main(['check', 'diagkit.demos.llama_lora:llama_lora', '--meta', "
            "'--arg', 'size=tiny']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "needs transformers and peft" in line and "pip install 'diagkit[demos]'" in line


def test_a_watch_without_report_to_loads_no_tracker_code():
    """The trackers are imported only when `report_to` names them: a watch that runs and ends
    without it loads neither a tracker package nor diagkit's code that sends to them."""
    watched = ("import torch, diagkit; m = torch.nn.Linear(2, 1); "
               "o = torch.optim.SGD(m.parameters(), lr=0.1); "
               "w = diagkit.watch(m, o, steps=2, live=False); "
               "[(o.zero_grad(), m(torch.ones(1, 2)).sum().backward(), o.step()) "
               "for _ in range(3)]; w.stop(); "
               "assert 'diagkit.run.trackers.watching' not in sys.modules")
    assert loaded_after(watched) == []
