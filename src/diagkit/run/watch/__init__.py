"""`diagkit.watch`: observing the user's own training in place, for `steps=N` (`watch`) or the
whole run (`whole_run`, `whole_run_names`, `whole_run_ranks`, `whole_run_result`), its options
(`options`), what it takes as it begins (`begin`), its observations on their way to the judge
(`observations`), its result's `meta` (`result_meta`), how it ends (`ends`, `children`,
`deferred_end`, `failed`, `save`), rank 0's side (`ranks`) and its trackers (`tracked`).

Imports `diagnose`, `live`, `workbook` and `trackers`; imported by integrations and the package.
"""
