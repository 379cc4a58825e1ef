"""The box's file work for `fs.*`: reading, writing, listing, stat and search, never following a link
out of the box.
"""
