"""Buckets: URLs, uploads with dedup figures, listings, ranged reads, downloads and a read cache.

`connect()` is the entry point; it resolves the endpoint from the settings, or starts the embedded server when
none is configured (`ensure_endpoint`). `resolve_endpoint` only resolves: it starts nothing.
"""

from __future__ import annotations

import os

from huggingface_hub import get_token

from ..config import Settings, load_settings
from .cache import ReadCache
from .client import BucketClient, Entry, FileUpload, NotFound, StorageError, TransferProgress, UploadReport
from .embedded import ensure_embedded_server
from .private import private_dir
from .urls import BadBucketUrl, BucketUrl

__all__ = [
    "BadBucketUrl",
    "BucketClient",
    "BucketUrl",
    "Entry",
    "FileUpload",
    "NotFound",
    "StorageError",
    "TransferProgress",
    "UploadReport",
    "connect",
    "ensure_endpoint",
    "private_dir",
    "resolve_endpoint",
]


def resolve_endpoint(settings: Settings) -> tuple[str, str | None] | None:
    """The configured endpoint and token (`storage.endpoint`, else HF_ENDPOINT; the token: `storage.token`, else
    huggingface_hub's); None when no endpoint is configured, the embedded server's case. Starts nothing.

    Example:
        ```python
        >>> resolve_endpoint(load_settings({"storage": {"endpoint": "http://127.0.0.1:8750", "token": "t"}}))
        ('http://127.0.0.1:8750', 't')
        ```
    """
    storage = settings.storage
    token = storage.token.get_secret_value() if storage.token else None
    endpoint = storage.endpoint or os.environ.get("HF_ENDPOINT")
    return (endpoint, token or get_token()) if endpoint else None


def ensure_endpoint(settings: Settings) -> tuple[str, str | None]:
    """The endpoint and token to use: `resolve_endpoint`'s, else the embedded server's, which this starts when it
    does not run yet (it keeps running for later commands).

    Raises:
        EmbeddedServerError: the embedded server did not start (its log is under `storage.embedded_root`).
    """
    resolved = resolve_endpoint(settings)
    if resolved is not None:
        return resolved
    storage = settings.storage
    server = ensure_embedded_server(storage.embedded_root, storage.embedded_port)
    token = storage.token.get_secret_value() if storage.token else None
    return server.endpoint, token or server.token


def connect(settings: Settings | None = None) -> BucketClient:
    """A client for the configured bucket endpoint (see `ensure_endpoint`). With no endpoint configured this starts
    the embedded bucket server on localhost, which keeps running for later commands (`robotloop bucket serve` for
    a shared one; `robotloop.storage.embedded.stop_embedded_server` stops it).

    Example:
        ```python
        >>> client = connect()                       # settings from robotloop.toml / ROBOTLOOP_* / HF_* variables
        >>> client.ls(BucketUrl.parse("hf://buckets/local/demos"))
        ```

    Raises:
        EmbeddedServerError: the embedded server did not start (its log is under `storage.embedded_root`).
    """
    settings = settings or load_settings()
    endpoint, token = ensure_endpoint(settings)
    return BucketClient(endpoint, token, ReadCache(settings.storage.cache_dir, settings.storage.cache_max_bytes))
