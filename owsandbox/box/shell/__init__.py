"""The named bash shells of the box: one bash per shell (markers, prompts, the reader), their registry,
their terminals, what they print and how it is kept, and completion.
"""
