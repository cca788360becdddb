"""The dashboard's library side: what `robotloop ui` shows, read through the services' clients (see `dashboard`).

The web app itself is `services/ui`; this layer holds no HTTP of its own and sits beside `agent`, on top of
`deploy`, `train` and `storage`.
"""

from .dashboard import Dashboard, UnknownItem

__all__ = ["Dashboard", "UnknownItem"]
