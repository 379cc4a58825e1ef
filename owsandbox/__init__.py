"""owsandbox: a Jupyter kernel whose cells run on persistent bash shells inside a sandbox."""

__version__ = "0.1.0"
