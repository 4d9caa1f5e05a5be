"""The live view of a watch in a notebook (`view`), the cell it follows (`cells`) and the grad
norms it plots (`trail`).

Imports `diagnose`; imported by `watch`.
"""
