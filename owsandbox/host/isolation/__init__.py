"""What keeps a box in: the workspace guard, seccomp filters, resource limits and the network, shared
by the bubblewrap, container and OpenSandbox providers.
"""
