"""``python -m services.capture --tokens FILE [--host H] [--port P]``: the same as `robotloop capture serve`."""

import sys

from robotloop.cli import app

app(["capture", "serve", *sys.argv[1:]], prog_name="python -m services.capture")
