"""The observed steps as they are recorded (`step_records`) and folded (`aggregate`: ranks into
one row per step and tensor, steps into one row per tensor), on `diagkit.core.schema`'s columns.

Imported by `step`, `clock`, and by judge, present and run, which read the tables; imports
nothing of diagkit but `core`.
"""
