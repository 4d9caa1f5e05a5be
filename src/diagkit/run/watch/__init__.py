"""`diagkit.watch`: observing the user's own training in place, for `steps=N` (`watch`) or the
whole run (`whole_run`, `whole_run_names`, `whole_run_ranks`), its options (`options`), how it
ends (`ends`, `failed`, `save`), rank 0's side (`ranks`) and its trackers (`tracked`).

Imports `diagnose`, `live`, `workbook` and `trackers`; imported by integrations and the package.
"""
