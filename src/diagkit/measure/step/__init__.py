"""Observing one training step: the observer (the only place torch hooks are set), what it knows
of the step in progress (`state`), how gradients are observed (`gradients`, `strategy_plan`,
`earned_share`), and what a step did not do (`rewrites`, `skips`).

Imports `batched`, `change`, `model`, `engines` and `tables`; imported by `clock` and run.
"""
