"""`diagkit compare CKPT_A CKPT_B` (`command`) and the comparison notebook: measure two
checkpoints against each other (`diagkit.measure.checkpoints.diff`), judge the differences,
build a `Comparison`.

A tensor that is bitwise identical in two saves taken some steps apart was not trained between
them: the orphan of the first seed (`mem_tokens`, in no optimizer group) shows up here as plainly
as in a diagnosis, from the checkpoints alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...core.files import check_output, write_json_atomic, write_text_atomic
from ...core.result import Comparison
from ...judge.comparison import comparison_findings
from ...measure.checkpoints.diff import diff_checkpoints
from . import contract
from ..target import deadline
from ..target.paths import resolve_paths


def command(args) -> int:
    """`diagkit compare`: outputs checked first; `--timeout` bounds the comparison and its
    report (`deadline.bound`: a checkpoint on a stalled mount, unpickling code that never
    returns), its expiry one line and exit 2."""
    from ..target.cli_run import EXIT_FINDINGS, EXIT_OK, check_notebook_text, report_exit
    check_output(args.json, "--json")
    params = {"checkpoint_a": args.checkpoint_a, "checkpoint_b": args.checkpoint_b,
              "trust_checkpoint": args.trust_checkpoint}
    if args.out:
        check_output(args.out, "--out")
        check_notebook_text(params)
    with deadline.bound(args.timeout, "comparing"):
        result = compare_checkpoints(args.checkpoint_a, args.checkpoint_b,
                                     trust=args.trust_checkpoint)
        from ...present.text import comparison_text
        print(comparison_text(result))
        if args.json:
            write_json_atomic(args.json, result.to_json_dict())
        if args.out:
            from .report import write_report
            report = write_report(args.out,
                                  {f"{args.checkpoint_a} vs {args.checkpoint_b}": params},
                                  title="diagkit: what changed between two checkpoints",
                                  notebook="compare_checkpoints.ipynb", check=validate)
            if report.error:
                return report_exit(report, "never")
            print(f"diagkit: report written to {report.html.resolve()}")
    return EXIT_FINDINGS if result.fails(args.fail_on) else EXIT_OK


def compare_checkpoints(path_a, path_b, trust: bool = False) -> Comparison:
    """Compare two checkpoints tensor by tensor (A the earlier save, B the later one).

    Each may be a PyTorch file (a bare state dict or one nested under model, state_dict, ...;
    loaded with weights_only unless `trust`), a `.safetensors` file, a Hugging Face sharded
    checkpoint or a torch.distributed.checkpoint folder (`checkpoint_kind`). Names that differ only
    by the DDP prefix `module.` are aligned (A's spelling is kept). Bad input raises
    DiagkitError with a one-line reason.
    """
    table, summary = diff_checkpoints(path_a, path_b, trust)
    findings = comparison_findings(table, summary, _same_file(path_a, path_b))
    return Comparison(str(path_a), str(path_b), table, findings, summary)


def _same_file(path_a, path_b) -> bool:
    try:
        return os.path.samefile(path_a, path_b)
    except OSError:  # pragma: no cover
        return False


def write_outputs(cmp: Comparison, out_dir: str | None) -> list[str]:
    """comparison.csv (every tensor) and findings.json (summary + findings), each atomically."""
    if not out_dir:
        return []
    folder = Path(out_dir)
    table = cmp.table.copy()
    for col in ("shape_a", "shape_b"):
        table[col] = table[col].map(lambda s: "" if s is None else " ".join(map(str, s)))
    write_text_atomic(folder / "comparison.csv", table.to_csv(index=False), newline="")
    write_json_atomic(folder / "findings.json", {
        "summary": cmp.summary, "findings": [f.to_dict() for f in cmp.findings],
        "worst": cmp.worst()})
    return ["comparison.csv", "findings.json"]


# ------------------------------------------------------------------ the notebook's contract
def validate(values: dict) -> dict:
    """Check names and types against the comparison notebook's parameters; fill defaults
    (what `diagkit compare --out` checks before it runs the notebook)."""
    return contract.validate(values, contract.COMPARE)


def check_parameters(namespace: dict) -> dict:
    """Called by the notebook right after its parameters: an unknown name papermill injected,
    or a wrong type, is an error. Relative checkpoint paths follow `diagkit.run.target.paths` (the
    launch folder, the notebook's folder, then the demo files diagkit ships)."""
    settings = contract.check_parameters(namespace, contract.COMPARE)
    return resolve_paths(settings, {"checkpoint_a": "checkpoint_a",
                                    "checkpoint_b": "checkpoint_b"})


def run(settings: dict) -> Comparison:
    """What the notebook's comparing cell does."""
    return compare_checkpoints(settings["checkpoint_a"], settings["checkpoint_b"],
                               trust=settings["trust_checkpoint"])
