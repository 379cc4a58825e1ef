"""The Jupyter kernel: cells on sandbox shells, magics, output handling."""
