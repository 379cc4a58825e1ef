"""The `%` magics: the framework and its table, the file and shell magics, `%attach` and `%send`,
`%sandbox`, `%terminal`, and the teaching magics.
"""
