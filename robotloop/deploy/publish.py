"""`publish`: turn a checkpoint in a bucket into a signed release, stored next to it and registered.

Accepts the checkpoint step folder (``<run>/checkpoints/000200``), its ``pretrained_model`` folder, or the run
(``<run>``, meaning its latest complete checkpoint per ``checkpoints/last.json``). The manifest lists the files
of ``pretrained_model/`` by the Xet hash the bucket holds for them, so robots fetch exactly the signed content.

A checkpoint on this machine (a lerobot-train output: ``outputs/train/<run>``, its ``checkpoints/last`` or a
``pretrained_model`` folder; or a robotloop one) is uploaded first, to ``<to>/checkpoints/<step>/pretrained_model``
in a bucket (robots fetch from buckets), then published from there.

Example:
    ```python
    >>> signed = publish(connect(), "hf://buckets/lab/demos/models/run1", "v2", load_private_key(key_path),
    ...                  deploy=DeployClient(url, token), channel="canary")
    ```
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..errors import BadInput
from ..storage import BucketClient, BucketUrl, Entry, NotFound
from ..train.layout import checkpoint_url, latest_step
from .client import DeployClient
from .keys import Signer
from .manifest import SignedManifest, build_manifest, check_release_name


class PublishError(BadInput, RuntimeError):
    """The checkpoint cannot be published (not found, incomplete, or the release name is taken)."""


def manifest_url(bucket_id: str, name: str) -> BucketUrl:
    return BucketUrl(bucket_id, f"releases/{check_release_name(name)}/manifest.json")


def resolve_checkpoint(client: BucketClient, url: BucketUrl) -> BucketUrl:
    """The checkpoint step folder `url` means (see the module docstring).

    Raises:
        PublishError: no checkpoint there.
    """
    parts = url.path.split("/")
    if parts[-1] == "pretrained_model":
        return BucketUrl(url.bucket_id, "/".join(parts[:-1]))
    if len(parts) >= 2 and parts[-2] == "checkpoints" and parts[-1].isdigit():  # checkpoints/2000 = .../002000
        return checkpoint_url(BucketUrl(url.bucket_id, "/".join(parts[:-2])), int(parts[-1]))
    step = latest_step(client, url)
    if step is None:
        raise PublishError(
            f"{url}: neither a checkpoint folder (<run>/checkpoints/<step>) nor a run with a complete "
            "checkpoint (no checkpoints/last.json)"
        )
    return checkpoint_url(url, step)


def upload_local_checkpoint(client: BucketClient, local: Path, to: BucketUrl) -> BucketUrl:
    """Upload the `pretrained_model` of a checkpoint on this machine (any folder `robotloop eval` takes: a
    lerobot-train output follows its `checkpoints/last` link) to `<to>/checkpoints/<step>/pretrained_model`.
    Returns that step folder's URL. Uploading the same files again is a no-op; other files there are refused,
    so a run's checkpoint in the bucket is never overwritten.

    Raises:
        PublishError: no checkpoint at `local`, its folder names no step, or the destination holds other files.
    """
    import hf_xet

    from .errors import PolicyLoadError
    from .resolve import locate_policy

    try:
        model = locate_policy(str(local)).path.resolve()  # lerobot's checkpoints/last is a symlink to the step
    except PolicyLoadError as error:
        raise PublishError(str(error)) from None
    if not model.parent.name.isdigit():
        raise PublishError(
            f"{model}: not in a checkpoint folder named by its step (<run>/checkpoints/<step>/pretrained_model), "
            "so the release could not say which step it is"
        )
    step_url = checkpoint_url(to, int(model.parent.name))
    model_url = step_url / "pretrained_model"
    files = sorted(p for p in model.rglob("*") if p.is_file())
    hashes = hf_xet.hash_files([str(p) for p in files])
    ours = {p.relative_to(model).as_posix(): h.hash for p, h in zip(files, hashes, strict=True)}
    try:
        listed = client.ls(model_url, recursive=True)
    except NotFound:  # no such bucket yet
        listed = []
    there = {e.url.path[len(model_url.path) + 1 :]: e.xet_hash for e in listed if isinstance(e, Entry)}
    if there and there != ours:
        raise PublishError(
            f"{model_url} already holds other files: publish it from there, or upload this checkpoint to another --to"
        )
    if not there:
        client.create_bucket(model_url)
        client.upload(model, model_url)
    return step_url


def publish(
    client: BucketClient,
    checkpoint: str,
    name: str,
    signer: Signer,
    deploy: DeployClient | None = None,
    channel: str | None = None,
    to: BucketUrl | None = None,
) -> SignedManifest:
    """Build, sign and store the release manifest of `checkpoint`, then register it (and point `channel` at it).
    `checkpoint`: a bucket URL, or a checkpoint on this machine, uploaded first under `to` (a bucket folder, e.g.
    ``hf://buckets/lab/demos/models/run1``: see `upload_local_checkpoint`).

    Example:
        ```python
        >>> signed = publish(connect(), "hf://buckets/lab/demos/models/run1", "v7", load_private_key(key_file),
        ...                  DeployClient.from_settings(settings), channel="canary")
        >>> signed.manifest.total_bytes, signed.key_id
        ```

    Raises:
        BadBucketUrl: `checkpoint` is not a bucket URL. PublishError: no checkpoint, no pretrained_model, a local
        checkpoint without `to` (or see `upload_local_checkpoint`), or `name` already names another release in
        this bucket. DeployError: the deploy service refused it.
        BadManifest: a bad release name. robotloop.storage.StorageError: the bucket cannot be reached or written.
    """
    check_release_name(name)
    if checkpoint.startswith("hf://"):
        step_url = resolve_checkpoint(client, BucketUrl.parse(checkpoint))
    elif to is None:
        raise PublishError(
            f"{checkpoint}: a checkpoint on this machine is published from a bucket: say which (--to "
            "hf://buckets/<ns>/<bucket>/models/<run>)"
        )
    else:
        step_url = upload_local_checkpoint(client, Path(checkpoint), to)
    model_url = step_url / "pretrained_model"
    try:  # listed once: the manifest's Xet hashes and the download come from the same listing
        entries = [e for e in client.ls(model_url, recursive=True) if isinstance(e, Entry)]
    except NotFound:
        entries = []
    if not entries:
        raise PublishError(f"{model_url}: no pretrained_model files; is the checkpoint complete?")
    hashes = {e.url.path[len(model_url.path) + 1 :]: e.xet_hash for e in entries}
    with tempfile.TemporaryDirectory() as tmp:
        client.download_tree(model_url, Path(tmp), entries)
        manifest = build_manifest(
            Path(tmp), name, step_url.bucket_id, str(step_url), hashes, _lineage(client, step_url)
        )
    signed = _store(client, SignedManifest.sign(manifest, signer))
    if deploy is not None:
        deploy.publish(signed, channel)
    return signed


def _lineage(client: BucketClient, step_url: BucketUrl) -> dict:
    try:
        entry = client.stat(step_url / "lineage.json")
        return json.loads(client.read_range(entry.url, 0, entry.size))
    except (NotFound, ValueError):
        return {}


def _store(client: BucketClient, signed: SignedManifest) -> SignedManifest:
    """Store the manifest; publishing the same files under the same name again keeps the first manifest."""
    url = manifest_url(signed.manifest.bucket, signed.manifest.name)
    try:
        existing = client.read_range(url, 0, client.stat(url).size)
    except NotFound:
        existing = None
    if existing is not None:
        old = SignedManifest.from_json(existing)
        if old.manifest.files != signed.manifest.files:
            raise PublishError(
                f"release {signed.manifest.name!r} already exists in {url} with other files; "
                "release names are immutable, pick a new one"
            )
        return old
    # The release holds its own paths to the signed files (metadata only: the bytes stay where they are), so
    # training into the run's folder again, which overwrites its checkpoint files, cannot take them from robots:
    # the store serves a file's bytes only to readers of a bucket that holds it.
    m = signed.manifest
    held = {f"{url.path.rsplit('/', 1)[0]}/files/{f.path}": f.xet_hash for f in m.files}
    client.point_back(BucketUrl(m.bucket, ""), held)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.json"
        path.write_bytes(signed.to_json())
        client.upload(path, url)
    return signed
