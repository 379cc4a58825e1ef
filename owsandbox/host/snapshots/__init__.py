"""Snapshots of a workspace, on this machine's side: the store, stopping a box around a restore, and
host paths found without following the box's links.
"""
