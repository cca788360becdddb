"""`robotloop capture serve`: the capture service, for robots that do not run the recorder themselves.

Its options are the service's own (:class:`services.capture.CaptureOptions`), as `python -m services.capture` has
them.
"""

from __future__ import annotations

import typer

from services.capture import CaptureOptions
from services.options import serve_command

from .output import fail

app = typer.Typer(no_args_is_help=True, help="The capture service: robots stream episodes, it commits them to buckets.")
app.command("serve")(serve_command(CaptureOptions, "services.capture.app", fail))
