"""The execd-compatible endpoint of the box: HTTP and WebSocket on a Unix socket, pipe and PTY
sessions, for `%attach` and the terminal.
"""
