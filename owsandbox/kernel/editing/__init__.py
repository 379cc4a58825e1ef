"""Help while writing a cell: completion, whether a cell is complete (the bash lexer), and the answers
a command asks for on stdin.
"""
