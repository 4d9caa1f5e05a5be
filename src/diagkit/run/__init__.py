"""Running: the orchestration on top (targets, the step loop, the observe -> judge pipeline,
the distributed launcher and worker, the CLI, the notebook contract and the report)."""
