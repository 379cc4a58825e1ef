"""A terminal into a kernel's sandbox: `owsandbox shell --existing [CONNECTION_FILE]`.

A notebook is not a terminal, so full-screen programs (vim, less, top, tmux, `git add -p`) need one of
their own, in the same sandbox as the notebook's kernel: the same files, private /tmp, limits and
network. The terminal is a new interactive bash in a PTY session of the box's execd-compatible
endpoint, reached over the host's own socket in the sandbox's private state folder; the kernel's
shells are not touched. The parts: `locate` (which kernel, which sandbox, where its endpoint is),
`boxshell` (the command the session runs), `rawterm` (the user's terminal in raw mode, its size),
`session` (the PTY session, its bytes both ways), `cli` (the command), `lab` (the same terminal in
JupyterLab, through jupyter_server's terminal manager).
"""
