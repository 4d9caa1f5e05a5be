"""Running a target's steps and judging them: the library calls (`api`), the one orchestrator
(`pipeline`), the step loop (`loop`), ranks (`launcher`, `rank_failure`, `worker`, `gather`),
the meta dry run (`meta`), and `--try-fix` (`fixes`, `try_fix`, `check_outputs`).

Imports `target`; imported by `live`, `watch`, `workbook` and `cli`.
"""
