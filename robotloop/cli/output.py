"""How every command reports a failure (see `robotloop.output`, which `python -m robotloop.train` shares)."""

from ..output import error_console, fail, quiet_encoders

__all__ = ["error_console", "fail", "quiet_encoders"]
