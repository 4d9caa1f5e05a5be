"""The notebooks and the report: the parameters-cell contract (`contract`), the calls the
diagnosis notebook makes (`notebook`, `printed`), `diagkit report`/`demo` (`report`,
`report_cells`), `diagkit notebooks` (`shipped_notebooks`), `diagkit compare` (`compare`) and
`diagkit.explore` (`explore`).

Imports `target` and `diagnose`; imported by `watch` and `cli`.
"""
