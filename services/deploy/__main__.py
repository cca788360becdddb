"""``python -m services.deploy --tokens FILE [--db PATH] [--host H] [--port P]``: the same as
`robotloop deploy serve`."""

import sys

from robotloop.cli import app

app(["deploy", "serve", *sys.argv[1:]], prog_name="python -m services.deploy")
