"""Observing one training step: the observer (the only place torch hooks are set), what it knows
of the step in progress (`state`), what an optimizer sees as it steps (`optimizer_reads`), the
step's one read-back (`step_end`), how gradients are observed (`gradients`, `backward_hooks`,
`fresh_norms`, `strategy_plan`, `earned_share`), and what a step did not do (`rewrites`,
`skips`).

Imports `batched`, `change`, `model`, `engines` and `tables`; imported by `clock` and run.
"""
