"""`publish`: turn a checkpoint in a bucket into a signed release, stored next to it and registered.

Accepts the checkpoint step folder (``<run>/checkpoints/000200``), its ``pretrained_model`` folder, or the run
(``<run>``, meaning its latest complete checkpoint per ``checkpoints/last.json``). The manifest lists the files
of ``pretrained_model/`` by the Xet hash the bucket holds for them, so robots fetch exactly the signed content.

The release also holds the policy exported to ONNX (`onnx_export.export_onnx`: one graph with the resize,
normalization and un-normalization, checked against torch), for robots that run it on ONNX Runtime, without torch,
and the manifest signs its three files as it signs the checkpoint's. The trainer exports its last checkpoint beside
it (`robotloop.train.checkpoint.export_onnx_beside`); publish reuses such an export when `onnx_export.stale_export`
finds it is exactly this checkpoint's (its metadata's sha256 of the checkpoint files and of the graph and weights
files, and the exporter's revision: hashing, ~1 s, where an export takes ~10 s of a 2-core machine for the default
ACT). Otherwise (none there, or one of other weights, of an older exporter, or altered) publish exports the
checkpoint itself and uploads the export into the release's folder, ``<bucket>/releases/<name>/files/``; its weights
are ONNX external data, the tensors' raw bytes, so Xet's dedup finds them in the safetensors file and the upload
adds little. `PublishedRelease.onnx` says which (`reused`, and `redone`: why the export found was not reused).
`onnx` says what a policy that cannot be exported does: ``required`` (the default: an `OnnxExportError` naming the
layer, and nothing is published), ``optional`` (the release goes out without ONNX, and `PublishedRelease.onnx.error`
says why) or ``off`` (no ONNX in the release, even where the checkpoint holds an export).

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
import logging
import multiprocessing as mp
import os
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import get_args

from ..config import OnnxMode
from ..errors import BadInput, BadValue
from ..storage import BucketClient, BucketUrl, Entry, NotFound
from ..train import layout as train_layout
from ..train.layout import checkpoint_url
from .client import DeployClient, DeployError
from .errors import OnnxExportError, PolicyLoadError
from .keys import Signer, load_private_key
from .manifest import SignedManifest, build_manifest, check_release_name
from .onnx_runner import INT8_FILES, ONNX_FILES

log = logging.getLogger(__name__)

ONNX_MODES: tuple[str, ...] = get_args(OnnxMode)  # deploy.onnx's choices


class PublishError(BadInput, RuntimeError):
    """The checkpoint cannot be published (not found, incomplete, or the release name is taken)."""


@dataclass(frozen=True)
class OnnxReport:
    """The ONNX export of one publish: the `files` it put into the release, the `seconds` it took (the checkpoint's
    own export fetched and checked; the export, its check against torch and its upload when one ran), the largest
    |ONNX - torch| action on the check batch, and the bytes its upload added (Xet dedup finds most of its weights in
    the safetensors file; 0 when reused); or, `onnx="optional"`, why there is none (`error`). `reused`: the export
    the trainer left beside the checkpoint went into the release as it is (no export ran); `redone`: why an export
    found there was not reused (None when there was none, or it was reused)."""

    seconds: float
    files: tuple[str, ...] = ()
    max_abs_diff: float | None = None
    bytes_new: int | None = None
    error: str | None = None
    reused: bool = False
    redone: str | None = None
    int8_max_abs_diff: float | None = None  # with `int8`: the int8 graph's largest |int8 - fp32| action
    int8_calibration_frames: int = 0  # frames of the training data drawn to calibrate its convolutions on
    int8_convolutions: str | None = None  # in int8 (calibrated on how many), or why they stayed fp32


@dataclass(frozen=True)
class PublishedRelease(SignedManifest):
    """What `publish` made: the signed manifest, and its ONNX export (None when none ran: `onnx="off"`, or the
    release existed already and was kept as it is)."""

    onnx: OnnxReport | None = None


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
    onnx: OnnxMode = "required",
    int8: bool = False,
) -> PublishedRelease:
    """Build, sign and store the release manifest of `checkpoint`, with its policy exported to ONNX (`onnx`: see the
    module docstring), then register it (and point `channel` at it). `checkpoint`: a bucket URL, or a checkpoint on
    this machine, uploaded first under `to` (a bucket folder, e.g. ``hf://buckets/lab/demos/models/run1``: see
    `upload_local_checkpoint`). `int8`: the export's int8 graph goes into the release too (`onnx_int8`: opt-in,
    for robot CPUs too slow for fp32; robots run it with backend ``onnx-int8``). The same checkpoint published
    again under the same name keeps the first release (its export too) and registers it again.

    Example:
        ```python
        >>> signed = publish(connect(), "hf://buckets/lab/demos/models/run1", "v7", load_private_key(key_file),
        ...                  DeployClient.from_settings(settings), channel="canary")
        >>> signed.manifest.total_bytes, signed.key_id, signed.onnx.seconds
        ```

    Raises:
        BadBucketUrl: `checkpoint` is not a bucket URL. PublishError: no checkpoint, no pretrained_model, a local
        checkpoint without `to` (or see `upload_local_checkpoint`), or `name` already names another release in
        this bucket. OnnxExportError: `onnx="required"` and the policy cannot be exported (the message names the
        layer; nothing was written under ``releases/<name>/``). DeployError: the deploy service refused it (then
        nothing of it is left in the bucket) or did not answer.
        BadManifest: a bad release name. BadValue: `onnx` is not one of `ONNX_MODES`, or `int8` with `onnx` off.
        OnnxExportError also: `int8` and the int8 graph cannot be made or is too far from fp32 (nothing published).
        robotloop.storage.StorageError: the bucket cannot be reached or written.
    """
    check_release_name(name)
    if onnx not in ONNX_MODES:
        raise BadValue(f"onnx={onnx!r}: use {', '.join(ONNX_MODES)}")
    if int8 and onnx == "off":
        raise BadValue("an int8 graph is made from the ONNX export: not with onnx off (--no-onnx)")
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
        listed = [e for e in client.ls(model_url, recursive=True) if isinstance(e, Entry)]
    except NotFound:
        listed = []
    # The checkpoint's files; an export found beside them is taken only once checked to be theirs (`_onnx`).
    entries = [e for e in listed if _relative(e, model_url) not in ONNX_FILES]
    exported = [e for e in listed if _relative(e, model_url) in ONNX_FILES]
    hashes = {_relative(e, model_url): e.xet_hash for e in entries}
    if not entries:
        raise PublishError(f"{model_url}: no pretrained_model files; is the checkpoint complete?")
    lineage = _lineage(client, step_url)
    stored = _stored(client, manifest_url(step_url.bucket_id, name))
    report = None
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        client.download_tree(model_url, model, entries)
        if stored is not None:  # published before: kept as it is if it is this checkpoint (no second export)
            checkpoint_files = build_manifest(model, name, step_url.bucket_id, str(step_url), hashes, lineage).files
            exports = (*ONNX_FILES, *INT8_FILES)
            if tuple(f for f in stored.manifest.files if f.path not in exports) != checkpoint_files:
                raise PublishError(_name_taken(name, manifest_url(step_url.bucket_id, name)))
            signed, written = stored, False
        else:
            if onnx != "off":
                report = _onnx(client, model_url, exported, model, Path(tmp) / "onnx", name, hashes, onnx)
                if int8 and report.error is None:
                    report = _int8(client, report, model, Path(tmp) / "int8", model_url, name, hashes, lineage)
            manifest = build_manifest(model, name, step_url.bucket_id, str(step_url), hashes, lineage)
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
    return PublishedRelease(signed.manifest, signed.key_id, signed.signature, report)


class Publisher:
    """A child process that publishes (`publish`: ONNX required, no int8), started before there is anything to
    publish, so that the caller's other work meanwhile hides its start: spawning it and importing torch, lerobot
    and torch's ONNX exporter (about 6 s of this 2-core machine, under a round's evaluation on the GPU machine's busy
    cores). A round starts one before it trains and publishes through it once the checkpoint is in the bucket.
    `cpu_threads`: torch's threads in the child, so that its export leaves the caller's other work its cores.

    A process, not a thread: torch's exporter traces with Dynamo, whose state is the whole process's, beside a
    policy the caller may have compiled. The child dies with this process; what it answers comes back over a local
    pipe, never a network. Close it (or use it as a context manager) when done: it exits once its work is.

    Example:
        ```python
        >>> with Publisher() as publisher:  # starts importing now
        ...     train(...)
        ...     publishing = publisher.publish(client, "hf://buckets/lab/demos/models/run1-r1", "run1-r1-3000",
        ...                                    key_path, deploy, channel="canary")
        ...     report = evaluate(...)  # meanwhile
        ...     publishing.result().onnx.seconds
        ```
    """

    def __init__(self, cpu_threads: int = 4) -> None:
        self._pool = ProcessPoolExecutor(
            1, mp_context=mp.get_context("spawn"), initializer=_start_publisher, initargs=(os.getpid(), cpu_threads)
        )
        self._pool.submit(_import_exporter)  # the child starts with this job

    def publish(
        self,
        client: BucketClient,
        checkpoint: str,
        name: str,
        key: Path,
        deploy: DeployClient,
        channel: str | None = None,
    ) -> Future[PublishedRelease]:
        """`publish` of `checkpoint` as `name` in the child, after what it was given before. `key`: the private
        deploy key's file, loaded there.

        Raises (from the future's `result()`): what `publish` raises.
        """
        return self._pool.submit(
            _publish_from, client.endpoint, client.token, checkpoint, name, key, deploy.url, deploy.token, channel
        )

    def close(self) -> None:
        """No more publishes: the child exits once those given are done (this does not wait for them)."""
        self._pool.shutdown(wait=False)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_publisher(parent_pid: int, cpu_threads: int) -> None:
    import torch

    from ..workers import start_worker

    start_worker(parent_pid)
    torch.set_num_threads(cpu_threads)


def _import_exporter() -> None:
    """What a publish imports besides torch: the export's modules (lerobot's ACT among them) and torch's exporter,
    which `torch.onnx` imports only when an export begins. Only a head start: should an import fail here (torch's
    module is private), the publish imports what it needs itself and reports that failure."""
    import torch.onnx._internal.exporter._core  # noqa: F401  (torch's own module: ~1 s of the imports)

    from . import onnx_export  # noqa: F401


def _publish_from(
    endpoint: str,
    token: str | None,
    checkpoint: str,
    name: str,
    key: Path,
    deploy_url: str,
    deploy_token: str,
    channel: str | None,
) -> PublishedRelease:
    deploy = DeployClient(deploy_url, deploy_token)
    return publish(BucketClient(endpoint, token), checkpoint, name, load_private_key(key), deploy, channel)


def _int8(
    client: BucketClient,
    report: OnnxReport,
    model: Path,
    out: Path,
    model_url: BucketUrl,
    name: str,
    hashes: dict[str, str],
    lineage: dict,
) -> OnnxReport:
    """The int8 graph of the export in `model`, made in `out`, uploaded into the release's folder and added to `model`
    and `hashes`; `report` with it. Its convolutions are calibrated on frames of the datasets `lineage` names (the
    checkpoint's training data); a checkpoint without them (trained elsewhere) gets MatMul and Gemm in int8 only.

    Raises:
        OnnxExportError: it cannot be made, or is too far from fp32 (`onnx_int8.quantize_int8`).
        DataError: the training data it calibrates on cannot be read.
    """
    from .onnx_int8 import calibration_inputs, quantize_int8

    # The convolutions too where the training data is known (robotloop's lineage): calibrated on its frames.
    datasets = [BucketUrl.parse(url) for url in lineage.get("datasets", [])]
    calibration = calibration_inputs(client, datasets, model) if datasets else []
    made = quantize_int8(model, out, calibration=calibration)
    bytes_new = _add_to_release(client, out, INT8_FILES, model, model_url, name, hashes)
    return replace(
        report,
        files=(*report.files, *INT8_FILES),
        seconds=report.seconds + made.seconds,
        bytes_new=(report.bytes_new or 0) + bytes_new,
        int8_max_abs_diff=made.max_abs_diff,
        int8_calibration_frames=len(calibration),
        int8_convolutions=made.convolutions,
    )


def _relative(entry: Entry, folder: BucketUrl) -> str:
    """`entry`'s path relative to `folder` (a file listed under it)."""
    return entry.url.path[len(folder.path) + 1 :]


def _onnx(
    client: BucketClient,
    model_url: BucketUrl,
    found: list[Entry],
    model: Path,
    out: Path,
    name: str,
    hashes: dict[str, str],
    mode: OnnxMode,
) -> OnnxReport:
    """The release's ONNX export, added to `model` (the checkpoint downloaded) and `hashes`: the checkpoint's own
    (`found`: its ONNX files listed under `model_url`) when `stale_export` finds it is exactly this checkpoint's,
    else one made here (`out`: where it is made) and uploaded into the release's folder. With `mode` "optional", a
    policy that cannot be exported is a report of why instead.

    Raises:
        OnnxExportError: `mode` "required" and the policy cannot be exported (nothing is uploaded then).
    """
    start = time.perf_counter()
    redone = None
    try:
        # torch, lerobot and the exporter: the publisher's machine has them (a missing one: ImportError below).
        from .onnx_export import export_onnx, stale_export
        from .onnx_runner import read_meta

        if found and len(found) < len(ONNX_FILES):  # all three or none is an export: a cut-short upload, say
            redone = f"an incomplete export ({', '.join(sorted(_relative(e, model_url) for e in found))} only)"
        elif found:
            client.download_tree(model_url, model, found)
            redone = stale_export(model)
            if redone is None:  # exported from exactly these files, and checked against torch then: taken as is
                hashes.update({_relative(e, model_url): e.xet_hash for e in found})
                diff = read_meta(model).max_abs_diff
                return OnnxReport(time.perf_counter() - start, ONNX_FILES, diff, 0, reused=True)
            log.info("release %s: the checkpoint's ONNX export is made again: %s", name, redone)
            for file in ONNX_FILES:  # not this checkpoint's: never signed into the release
                (model / file).unlink()
        export = export_onnx(model, out)
    except (OnnxExportError, PolicyLoadError, ImportError) as error:
        seconds = time.perf_counter() - start
        why = f"{type(error).__name__}: {error}" if isinstance(error, ImportError) else str(error)
        if mode == "required":
            raise OnnxExportError(
                f"release {name!r} not published: its policy cannot be exported to ONNX ({why})"
            ) from error
        log.warning("release %s goes out without ONNX (robots run it with torch): %s", name, why)
        for file in ONNX_FILES:  # the checkpoint's export, if it was downloaded: not this release's
            (model / file).unlink(missing_ok=True)
        return OnnxReport(seconds, error=why, redone=redone)
    bytes_new = _add_to_release(client, out, export.files, model, model_url, name, hashes)
    return OnnxReport(time.perf_counter() - start, export.files, export.max_abs_diff, bytes_new, redone=redone)


def _add_to_release(
    client: BucketClient,
    out: Path,
    files: tuple[str, ...],
    model: Path,
    model_url: BucketUrl,
    name: str,
    hashes: dict[str, str],
) -> int:
    """Upload the folder `out` into release `name`'s files, record their Xet hashes in `hashes` and move `files`
    beside the checkpoint's in `model` (what the manifest lists and robots install); the bytes the upload added."""
    folder = manifest_url(model_url.bucket_id, name).path.rsplit("/", 1)[0]
    uploaded = client.upload(out, BucketUrl(model_url.bucket_id, f"{folder}/files"))
    for file in uploaded.files:
        hashes[PurePosixPath(file.path).name] = file.xet_hash
    for file in files:
        os.replace(out / file, model / file)
    return uploaded.bytes_new


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


def _stored(client: BucketClient, url: BucketUrl) -> SignedManifest | None:
    """The release manifest stored at `url`, if there is one."""
    try:
        return SignedManifest.from_json(client.read_range(url, 0, client.stat(url).size))
    except NotFound:
        return None


def _name_taken(name: str, url: BucketUrl) -> str:
    return f"release {name!r} already exists in {url} with other files; release names are immutable, pick a new one"


def _store(client: BucketClient, signed: SignedManifest) -> tuple[SignedManifest, bool]:
    """Store the manifest; publishing the same files under the same name again keeps the first manifest. Answers
    the manifest stored, and whether this call wrote it."""
    url = manifest_url(signed.manifest.bucket, signed.manifest.name)
    old = _stored(client, url)  # again: another publish of that name may have stored it meanwhile
    if old is not None:
        if old.manifest.files != signed.manifest.files:
            raise PublishError(_name_taken(signed.manifest.name, url))
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
