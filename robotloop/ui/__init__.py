"""The dashboard's library side: what `robotloop ui` shows, read through the services' clients (see `dashboard`).

The web app itself is `services/ui`; this layer holds no HTTP of its own and sits beside `agent`, on top of
`deploy`, `train` and `storage`. `Dashboard` holds three views: `fleet` (fleet.py), `data` (datasets.py) and
`runs` (runs.py).
"""

from .dashboard import Dashboard
from .datasets import DatasetViews
from .fleet import FleetViews
from .names import UnknownItem
from .runs import RunViews

__all__ = ["Dashboard", "DatasetViews", "FleetViews", "RunViews", "UnknownItem"]
