"""What the dashboard shows, composed from the services' own clients: the deploy service (fleet, releases,
history), the training service (jobs and their progress), the bucket server (datasets, episodes, videos,
checkpoints, and the loop reports and evaluations `robotloop loop` uploads beside its runs) and the report folders
on this machine (loop reports, evaluations).

Nothing here reaches into a service: each figure is what `robotloop deploy status`, `trainer watch`, `bucket ls`
or the agent's tools read, reshaped for a page. Every answer is plain JSON types; the web app
(`services/ui`) serves them as they are. The pages fall into three views, each its own class: `FleetViews`
(fleet, releases, promote, roll back), `DatasetViews` (datasets, episodes, videos) and `RunViews` (training
jobs, checkpoints, loop reports, evaluations).

Example:
    ```python
    >>> board = Dashboard(load_settings())
    >>> [r["id"] for r in board.fleet.overview()["robots"]]
    ['r1', 'r2']
    >>> board.data.dataset("hf://buckets/lab/demos/datasets/cube")["episodes"][0]["video"]
    {'observation.images.top': {'url': 'hf://.../file-000.mp4', 'from_s': 0.0, 'to_s': 8.0}}
    ```
"""

from __future__ import annotations

from pathlib import Path

from ..clients import ServiceClients
from ..config import Settings
from .datasets import DatasetViews
from .fleet import FleetViews
from .runs import RunViews


class Dashboard:
    """The dashboard's views over one set of settings, sharing one set of service clients (made on first use,
        so a dashboard without a training service token still shows the fleet; the training page says which token
        is missing). Loop reports and evaluations come from the runs' buckets (`<run>/report/`) and from the folders
    `reports` (default: `ui.reports`)."""

    def __init__(self, settings: Settings, reports: list[Path] | None = None) -> None:
        self.settings = settings
        self.clients = ServiceClients(settings)
        self.runs = RunViews(self.clients, [Path(p) for p in (settings.ui.reports if reports is None else reports)])
        self.fleet = FleetViews(self.clients, self.runs)
        self.data = DatasetViews(self.clients)
