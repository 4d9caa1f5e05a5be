"""What `pip install diagkit` pulls into a fresh environment, measured with pip's own resolver
(README, "Install"; goal: the core at most 25 packages beside torch's own).

    .venv/bin/python benchmarks/install_size.py [--out out/install_size.json]

For the core, `[workbook]`, `[trackers]` and `[all]`: `pip install --dry-run --ignore-installed
--report` of the wheel built from this tree, with constraints.txt and torch==2.13.0 as
`make setup` installs them. Nothing is installed; the index is reached (a benchmark, not a
test: tests/test_core_dependencies.py counts the same offline). pip's configuration files are
left out (`PIP_CONFIG_FILE=/dev/null`: a machine's extra indexes and constraints); its
environment (`PIP_FIND_LINKS`, ...) is not, so torch may be a local build (the table says
which): the figures beside torch do not depend on it.

"Beside torch" counts every package the install adds but torch and what torch itself requires
(its own closure, from the same report: on Linux its CUDA libraries), diagkit included. Before
the split (issue 38), `pip install diagkit` resolved 118 packages: the core plus today's
`[workbook]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("", "workbook", "trackers", "all")
GOAL = 25


def build_wheel(folder: Path) -> Path:
    """This tree's wheel, built from a clean copy (a build/ left over would add stale modules);
    no dependencies resolved: they are what is measured."""
    tree = folder / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "out", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(folder), str(tree)], check=True)
    return next(folder.glob("diagkit-*.whl"))


def resolve(wheel: Path, extra: str, folder: Path) -> list[dict]:
    """The `install` list of pip's report for `wheel[extra]` (every package, none skipped as
    already installed)."""
    report = folder / f"report-{extra or 'core'}.json"
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "DS_BUILD_OPS": "0"}
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                    "--quiet", "--no-build-isolation", "--report", str(report),
                    "-c", str(REPO / "constraints.txt"), "torch==2.13.0", target],
                   check=True, env=env)
    return json.loads(report.read_text())["install"]


def own_closure(installs: list[dict], root: str) -> set[str]:
    """`root` and what it requires, through the report's packages (markers for this Python)."""
    requires = {canonicalize_name(i["metadata"]["name"]): i["metadata"].get("requires_dist", [])
                for i in installs}
    seen, todo = set(), [canonicalize_name(root)]
    while todo:
        name = todo.pop()
        if name in seen or name not in requires:
            continue
        seen.add(name)
        for line in requires[name]:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def measure(wheel: Path, extra: str, folder: Path) -> dict:
    started = time.perf_counter()
    installs = resolve(wheel, extra, folder)
    names = sorted(canonicalize_name(i["metadata"]["name"]) for i in installs)
    torch_own = own_closure(installs, "torch")
    beside = sorted(set(names) - torch_own)
    torch = next(i for i in installs if canonicalize_name(i["metadata"]["name"]) == "torch")
    return {"extra": extra or "core", "packages": len(names), "torch_own": len(torch_own),
            "torch": f"{torch['metadata']['version']} ({torch['download_info']['url']})",
            "beside_torch": len(beside), "names_beside_torch": beside,
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/install_size.json", help="JSON of the figures")
    parser.add_argument("--extra", action="append", choices=EXTRAS[1:],
                        help="measure only the core and these extras (repeatable)")
    args = parser.parse_args(argv)
    extras = ("", *args.extra) if args.extra else EXTRAS
    with tempfile.TemporaryDirectory(prefix="diagkit-install-size-") as tmp:
        folder = Path(tmp)
        wheel = build_wheel(folder)
        rows = [measure(wheel, extra, folder) for extra in extras]
    print(f"{'install':<22} {'packages':>8} {'torch own':>9} {'beside torch':>12}")
    for r in rows:
        label = "diagkit" if r["extra"] == "core" else f"diagkit[{r['extra']}]"
        print(f"{label:<22} {r['packages']:>8} {r['torch_own']:>9} {r['beside_torch']:>12}")
    core = rows[0]
    print(f"\ntorch {core['torch']}")
    verdict = "meets" if core["beside_torch"] <= GOAL else "MISSES"
    print(f"the core {verdict} the goal: {core['beside_torch']} packages beside torch's own "
          f"(at most {GOAL}): {', '.join(core['names_beside_torch'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"python": sys.version.split()[0], "rows": rows},
                                         indent=1) + "\n")
    return 0 if core["beside_torch"] <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
