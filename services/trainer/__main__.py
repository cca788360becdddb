"""``python -m services.trainer --tokens FILE [--root DIR] [--host H] [--port P]``: the same as
`robotloop trainer serve`."""

import sys

from robotloop.cli import app

app(["trainer", "serve", *sys.argv[1:]], prog_name="python -m services.trainer")
