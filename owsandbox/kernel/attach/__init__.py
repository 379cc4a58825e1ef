"""`%attach`: a long-running program in the box, its channel, its records and their view, and JSON-RPC
conversations with it.
"""
