"""`publish`: turn a checkpoint in a bucket into a signed release, stored next to it and registered.

Accepts the checkpoint step folder (``<run>/checkpoints/000200``), its ``pretrained_model`` folder, or the run
(``<run>``, meaning its latest complete checkpoint per ``checkpoints/last.json``). The manifest lists the files
of ``pretrained_model/`` by the Xet hash the bucket holds for them, so robots fetch exactly the signed content.

A checkpoint on this machine (a lerobot-train output: ``outputs/train/<run>``, its ``checkpoints/last`` or a
``pretrained_model`` folder; or a robotloop one, e.g. copied out with ``robotloop bucket get
<run>/checkpoints/<step> ./ckpt``) is uploaded first, to ``<to>/checkpoints/<step>/pretrained_model`` in a bucket
(robots fetch from buckets), then published from there. Its step: the name of the folder above
``pretrained_model``, else the step its ``training_state/training_step.json`` or ``lineage.json`` beside says.

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
from ..train import layout as train_layout
from ..train.layout import checkpoint_url
from .client import DeployClient, DeployError
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
    if parts[-1] == "pretrained_model":  # whatever folder holds it is the step folder (an uploaded local one too)
        return BucketUrl(url.bucket_id, "/".join(parts[:-1]))
    try:  # a step folder (checkpoints/2000 = .../002000) or a run's latest: as the trainer's --init-from reads it
        return train_layout.resolve_checkpoint(client, url)
    except NotFound as error:
        raise PublishError(str(error)) from None


def upload_local_checkpoint(client: BucketClient, local: Path, to: BucketUrl) -> BucketUrl:
    """Upload the `pretrained_model` of a checkpoint on this machine (any folder `robotloop eval` takes: a
    lerobot-train output follows its `checkpoints/last` link) to `<to>/checkpoints/<step>/pretrained_model`.
    Returns that step folder's URL. Uploading the same files again is a no-op; other files there are refused,
    so a run's checkpoint in the bucket is never overwritten.

    Raises:
        PublishError: no checkpoint at `local`, nothing says its step (`local_step`), or the destination holds
            other files.
    """
    import hf_xet

    from .errors import PolicyLoadError
    from .resolve import locate_policy

    try:
        model = locate_policy(str(local)).path.resolve()  # lerobot's checkpoints/last is a symlink to the step
    except PolicyLoadError as error:
        raise PublishError(str(error)) from None
    step_url = checkpoint_url(to, local_step(model))
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


def local_step(model: Path) -> int:
    """The training step of the `pretrained_model` folder `model` on this machine: the name of the folder it is in
    (``<run>/checkpoints/000200``), else the step that lerobot's and robotloop's `training_state/training_step.json`
    or robotloop's `lineage.json` beside it says (a checkpoint copied into a folder of any name).

    Raises:
        PublishError: none of them says.
    """
    if model.parent.name.isdigit():
        return int(model.parent.name)
    for said in (model.parent / "training_state" / "training_step.json", model.parent / "lineage.json"):
        try:
            step = json.loads(said.read_text()).get("step")
        except (OSError, ValueError, AttributeError):  # missing, unreadable, or not a JSON object
            continue
        if isinstance(step, int) and step >= 0:
            return step
    raise PublishError(
        f"{model}: which training step is it? Neither is its folder named by its step (<run>/checkpoints/<step>/"
        "pretrained_model) nor is training_state/training_step.json or lineage.json beside it; copy the whole "
        "checkpoint folder (robotloop bucket get <run>/checkpoints/<step> ./ckpt), or publish it from its bucket"
    )


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
        this bucket. DeployError: the deploy service refused it (then nothing of it is left in the bucket) or did
        not answer.
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
    signed, written = _store(client, SignedManifest.sign(manifest, signer))
    if deploy is not None:
        try:
            deploy.publish(signed, channel)
        except DeployError as error:
            # Stored first, registered second: a publish cut short between the two (a crash, no answer) leaves a
            # manifest that the same publish again registers as it is. A service that refused it (4xx: untrusted
            # signer, a name taken, a token that may not publish) registered nothing: what this call wrote goes,
            # so the bucket holds no release that robots will never be given. Without such an answer it stays:
            # the service may have registered it, and a new manifest under its name would conflict there for good.
            if written and 400 <= error.status < 500:
                _unstore(client, signed)
            raise
    return signed


def _lineage(client: BucketClient, step_url: BucketUrl) -> dict:
    try:
        entry = client.stat(step_url / "lineage.json")
        return json.loads(client.read_range(entry.url, 0, entry.size))
    except (NotFound, ValueError):
        return {}


def _held_paths(signed: SignedManifest) -> dict[str, str]:
    """The release's own paths to its signed files (bucket-relative), with their Xet hashes."""
    folder = manifest_url(signed.manifest.bucket, signed.manifest.name).path.rsplit("/", 1)[0]
    return {f"{folder}/files/{f.path}": f.xet_hash for f in signed.manifest.files}


def _store(client: BucketClient, signed: SignedManifest) -> tuple[SignedManifest, bool]:
    """Store the manifest; publishing the same files under the same name again keeps the first manifest. Answers
    the manifest stored, and whether this call wrote it."""
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
        return old, False
    # The release holds its own paths to the signed files (metadata only: the bytes stay where they are), so
    # training into the run's folder again, which overwrites its checkpoint files, cannot take them from robots:
    # the store serves a file's bytes only to readers of a bucket that holds it.
    client.point_back(BucketUrl(signed.manifest.bucket, ""), _held_paths(signed))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.json"
        path.write_bytes(signed.to_json())
        client.upload(path, url)
    return signed, True


def _unstore(client: BucketClient, signed: SignedManifest) -> None:
    """Remove what `_store` wrote for `signed` (its manifest and its paths to the files), in one batch."""
    url = manifest_url(signed.manifest.bucket, signed.manifest.name)
    gone = dict.fromkeys([*_held_paths(signed), url.path])
    client.point_back(BucketUrl(signed.manifest.bucket, ""), gone)
