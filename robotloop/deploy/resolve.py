"""Which policy `--policy` means: a local folder, a bucket URL or a release name, resolved to a LeRobot
`pretrained_model` directory on this machine, and what it was resolved from (the checkpoint "latest" meant).

Example:
    ```python
    >>> found = locate_policy("hf://buckets/lab/demos/models/run1", lambda: connect())
    >>> found.path, found.checkpoint         # the newest complete checkpoint, downloaded once into the cache
    (PosixPath('~/.cache/robotloop/policies/3f2a...'), 'hf://buckets/lab/demos/models/run1/checkpoints/000500')
    >>> resolve_policy("outputs/train/act_cube")  # a lerobot-train output directory: its checkpoints/last
    PosixPath('outputs/train/act_cube/checkpoints/000500/pretrained_model')
    ```
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..storage import BadBucketUrl, BucketClient, BucketUrl, connect, private_dir
from .errors import PolicyLoadError


@dataclass(frozen=True)
class ResolvedPolicy:
    """A local `pretrained_model` directory, and the checkpoint it is (a checkpoint URL or folder, or a release
    name): an evaluation report names the step a run's "latest" was at the time."""

    path: Path
    checkpoint: str


def locate_policy(
    spec: str,
    client_factory: Callable[[], BucketClient] | None = None,
    cache_dir: Path | None = None,
    release_resolver: Callable[[str], Path] | None = None,
) -> ResolvedPolicy:
    """Turn `--policy` into a local LeRobot `pretrained_model` directory.

    Accepted:
        - a local `pretrained_model` dir, a checkpoint dir (`.../checkpoints/<step>`), a robotloop run dir (the
          step named in `checkpoints/last.json`) or a lerobot-train output dir (its `checkpoints/last` link);
        - a bucket URL of a robotloop run or checkpoint: `hf://buckets/<ns>/<b>/models/<run>[/checkpoints/<step>]`,
          downloaded through `robotloop.storage` (the read cache makes a second download free).
    Anything else is a release name, handed to `release_resolver` (the CLI passes one that pulls the release
    through the deploy service and verifies it as a robot would: `robotloop.deploy.store.pull_release`).

    Args:
        client_factory: makes the BucketClient (called only for URLs), e.g. `lambda: connect(settings)`.
        cache_dir: where downloaded checkpoints go (default: robotloop's cache dir).

    Raises:
        PolicyLoadError: nothing there, no complete checkpoint in the run, or not a policy at all.
    """
    if spec.startswith("hf://"):
        return _resolve_bucket(spec, client_factory, cache_dir)
    local = Path(spec).expanduser()
    if local.exists():
        path = _resolve_local(local)
        return ResolvedPolicy(path, str(path.parent if path.name == "pretrained_model" else path))
    if "/" in spec or spec.startswith(("~", ".")):  # release names have no slashes: a path that is not there
        raise PolicyLoadError(
            f"{spec}: no such directory (a policy is a local checkpoint folder, a bucket URL "
            "hf://buckets/..., or a release name)"
        )
    return ResolvedPolicy((release_resolver or resolve_release)(spec), f"release {spec}")


def resolve_policy(
    spec: str,
    client_factory: Callable[[], BucketClient] | None = None,
    cache_dir: Path | None = None,
    release_resolver: Callable[[str], Path] | None = None,
) -> Path:
    """`locate_policy(...).path`: the local `pretrained_model` directory only.

    Raises:
        PolicyLoadError: see `locate_policy`.
    """
    return locate_policy(spec, client_factory, cache_dir, release_resolver).path


def locate_policy_for(
    settings: Settings, spec: str, client_factory: Callable[[], BucketClient] | None = None
) -> ResolvedPolicy:
    """`locate_policy` with robotloop's settings, what the CLI and the agent's tool use: downloads under the cache
    dir, release names pulled through the deploy service and verified (`pull_release_for`).

    Raises:
        PolicyLoadError, and for release names DeployError / BadSignature / IntegrityError.
    """
    return locate_policy(
        spec,
        client_factory or (lambda: connect(settings)),
        settings.storage.cache_dir.parent / "policies",
        release_resolver=lambda name: pull_release_for(settings, name),
    )


def pull_release_for(settings: Settings, name: str) -> Path:
    """Release `name` pulled through the deploy service (deploy.url, deploy.token) and verified as robots do, with
    the keys robots trust (robot.trusted_keys, deploy.trusted_keys, else the deploy key's public half).

    Raises:
        PolicyLoadError: no trusted keys configured. DeployError, BadSignature, IntegrityError: see `pull_release`.
    """
    from ..storage import ensure_endpoint
    from .client import DeployClient
    from .fetch import XetFetcher
    from .keys import load_public_keys, public_path
    from .store import ReleaseStore, pull_release

    keys = settings.robot.trusted_keys or settings.deploy.trusted_keys
    if not keys and public_path(settings.deploy.key_file).exists():
        keys = [public_path(settings.deploy.key_file)]
    if not keys:
        raise PolicyLoadError(
            f"{name!r}: to evaluate a release, configure the keys that sign releases (robot.trusted_keys)"
        )
    endpoint, storage_token = ensure_endpoint(settings)
    store = ReleaseStore(settings.storage.cache_dir.parent / "eval-releases")
    return pull_release(
        name,
        DeployClient.from_settings(settings),
        lambda b: XetFetcher(endpoint, storage_token, b),
        load_public_keys(keys),
        store,
    )


def resolve_release(name: str) -> Path:
    """Without a deploy service to ask, a name that is not a path or URL cannot be resolved.

    Raises:
        PolicyLoadError: always.
    """
    raise PolicyLoadError(
        f"{name!r} is neither a local checkpoint directory, an hf://buckets/... URL, nor (with no deploy service "
        "configured) a release name"
    )


def _resolve_local(path: Path) -> Path:
    from ..train.layout import STEP_DIR

    if (path / "config.json").is_file():
        return path
    if (path / "pretrained_model").is_dir():
        return path / "pretrained_model"
    last = path / "checkpoints" / "last.json"
    if last.is_file():
        step = json.loads(last.read_text())["step"]
        return path / "checkpoints" / STEP_DIR.format(step) / "pretrained_model"
    lerobot_last = path / "checkpoints" / "last" / "pretrained_model"  # lerobot-train's `last` is a symlink
    if lerobot_last.is_dir():
        return lerobot_last.resolve()
    raise PolicyLoadError(
        f"{path}: neither a pretrained_model directory, a checkpoint directory, a robotloop run directory "
        "(checkpoints/last.json) nor a lerobot-train output directory (checkpoints/last)"
    )


def _resolve_bucket(
    spec: str, client_factory: Callable[[], BucketClient] | None, cache_dir: Path | None
) -> ResolvedPolicy:
    from ..config import cache_home
    from .publish import PublishError, resolve_checkpoint

    try:
        url = BucketUrl.parse(spec)
    except BadBucketUrl as error:
        raise PolicyLoadError(str(error)) from None
    client = client_factory() if client_factory else connect()
    try:
        checkpoint = resolve_checkpoint(client, url)
    except PublishError as error:
        raise PolicyLoadError(str(error)) from None
    model = checkpoint / "pretrained_model"
    key = hashlib.sha256(f"{client.endpoint}|{model}".encode()).hexdigest()[:16]
    dest = private_dir(cache_dir or cache_home() / "policies") / key
    if not client.download_tree(model, dest):
        raise PolicyLoadError(f"{model}: no files there")
    return ResolvedPolicy(dest, str(checkpoint))
