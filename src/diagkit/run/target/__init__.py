"""What to run and the bounds of running it: a target and its spec (`target`, `spec`), its
command-line arguments (`cli_run`), `--timeout` (`deadline`), SIGINT/SIGTERM (`signals`) and
what a relative path means (`paths`).

The floor of `run`: imports nothing else of it; every other room may import it.
"""
