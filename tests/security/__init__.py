"""Attacks on the sandbox's runner, each written as the exploit it guards against."""
