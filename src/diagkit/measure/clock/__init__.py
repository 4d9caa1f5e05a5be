"""Counting the steps of a loop diagkit does not run: `steps=N` (`step_clock`), the whole run
(`run_clock`, `kept_steps`, `new_optimizers`, `wiring`), loops without an optimizer
(`backward_ticks`) and ranks that never step (`first_step`).

Imports `step`, `model` and `tables`; imported by run only.
"""
