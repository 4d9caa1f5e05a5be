"""The `diagkit` console script (`commands`): parses, checks and dispatches each command.

The top of `run`: imports `target`, `diagnose` and `workbook`; nothing imports it.
"""
