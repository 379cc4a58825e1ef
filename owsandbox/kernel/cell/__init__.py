"""A cell on its way out: records become outputs, notes and hints, named limit errors, the terminal
text of a console, and the one door (outbox and budget) every output leaves by.
"""
