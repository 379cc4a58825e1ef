"""HTML the kernel makes is kept out of the notebook's math typesetting.

JupyterLab, the classic Notebook and nbconvert run MathJax over every output: a `%shells` table whose
folder is `$HOME/$PROJECT`, or a `%search` line `echo "price: $PRICE, tax: $TAX"`, would show math
italics, its dollars gone. In a bash kernel `$` is everywhere, so every table or page the kernel makes
goes out inside a container MathJax skips: `tex2jax_ignore` (MathJax 2, and JupyterLab's setting for
MathJax 3) and `mathjax_ignore` (MathJax 3's own default).
"""

from __future__ import annotations

NO_MATH_CLASSES = "tex2jax_ignore mathjax_ignore"


def no_math(page: str) -> str:
    """`page` (HTML) inside a container the notebook's math typesetting skips."""
    return f'<div class="{NO_MATH_CLASSES}">{page}</div>'
