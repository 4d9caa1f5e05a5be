"""Judging: pure functions from the measured tables to verdicts, findings and advice.

A verdict's rule, severity, meaning, message and fix live together (`diagkit.judge.verdict`
and the rule modules beside it). A rule that crashes becomes an error finding, not a crash.
"""
