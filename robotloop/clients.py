"""The clients of robotloop's services over one set of settings, shared by the front ends that call several of
them (the agent's tools, the dashboard).

Example:
    ```python
    >>> clients = ServiceClients(load_settings())
    >>> clients.deploy.status()["channels"]
    {'stable': 'r-2026-11-30', 'canary': 'r-2026-12-01'}
    ```
"""

from __future__ import annotations

import functools

from .config import Settings
from .deploy.client import DeployClient
from .storage import BucketClient, connect
from .train.client import TrainerClient


class ServiceClients:
    """The deploy, training and bucket clients of `settings`, each made on first use and kept.

    Made lazily so a front end without a training service token still reaches the deploy service (and the one
    call that needs the trainer says which token is missing), and the embedded bucket server starts only when
    storage is first read.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @functools.cached_property
    def deploy(self) -> DeployClient:
        return DeployClient.from_settings(self.settings)

    @functools.cached_property
    def trainer(self) -> TrainerClient:
        return TrainerClient.from_settings(self.settings)

    @functools.cached_property
    def bucket(self) -> BucketClient:
        return connect(self.settings)  # may start the embedded bucket server: once, and only when needed
