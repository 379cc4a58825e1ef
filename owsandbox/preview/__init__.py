"""`%preview`: a web app listening in a kernel's sandbox, served by the Jupyter server that runs the kernel.

This package is a jupyter_server extension (enabled by `jupyter_server_config.d/owsandbox.json`, which
the package installs): it adds `/owsandbox/preview/<kernel id>/<port>/…` to the server (`handlers.py`),
relayed to the port through the sandbox's execd endpoint (`tunnel.py`; the box's side is
`box/execd/portrelay.py`), with what passes filtered both ways (`headers.py`) and only the ports the
kernel's `%preview` recorded (`record.py`). Nothing of the server is imported until the server loads it,
so the kernel can use the rest.
"""

from __future__ import annotations

import os
from typing import Any

from ..settings import PREVIEW_BASE_URL


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "owsandbox.preview"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.utils import url_path_join

    from .handlers import ROUTE, PreviewHandler

    web_app = serverapp.web_app
    route = url_path_join(web_app.settings["base_url"], ROUTE)
    web_app.add_handlers(".*$", [(route, PreviewHandler)])
    # The kernels this server starts from now on learn where their previews are served (and that they are).
    os.environ[PREVIEW_BASE_URL] = web_app.settings["base_url"]
    serverapp.log.info("owsandbox: previews of sandboxes' ports at %s", route)
