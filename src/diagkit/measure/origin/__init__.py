"""Where the user's code built things: each optimizer and param group (`provenance`), an
optimizer handed to a framework (`handed`), the reading of the user's code both share
(`user_code`), the names in the `watch(...)` call (`watch_call`), and notebook cells as the
user knows them (`cells`).

Reads source text, never tensors; imports nothing else of `measure`. Imported by judge (for
wording), run and integrations.
"""
