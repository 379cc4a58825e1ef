"""Teaching without I/O: a session's recording (asciicast) and `%%check`'s script and report."""
