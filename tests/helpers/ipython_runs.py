"""A fresh interpreter under a real IPython shell (no kernel), for the live view's tests: the
shell is never left behind in the test process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HELPERS = Path(__file__).resolve().parent


def in_ipython(code: str) -> dict:
    """Run `code` in a new interpreter under a real IPython shell (no kernel: `live=True`
    shows the panel there); it prints one JSON object, returned here."""
    prelude = f"""
        import json, sys, time
        sys.path.insert(0, {str(HELPERS)!r})
        from IPython.core.interactiveshell import InteractiveShell
        InteractiveShell.instance()
        import torch, diagkit
        import diagkit.run.live.view as live
        from models import TwoHeads, two_heads_groups
        torch.manual_seed(0)
        model = TwoHeads()
        opt = torch.optim.SGD(two_heads_groups(dict(model.named_parameters()), planted=True),
                              lr=0.05)
        def train(n, w=None, sleep=0.0, seen=None):
            for _ in range(n):
                model(torch.randn(4, 8)).backward()
                opt.step()
                opt.zero_grad()
                time.sleep(sleep)
                if seen is not None:
                    seen.append(w.live.panel.status.value + w.live.panel.findings.value)
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
