"""Presenting: text, HTML, figures and the explorer, from result objects and tables only.

Nothing here measures: a plot function takes a table and returns a figure.
"""
