"""Release manifests: every file of a checkpoint with its size, Xet hash, SHA-256 and segments, signed.

A manifest is JSON; what is signed is its canonical form (sorted keys, no spaces), so the signature does not
depend on how the JSON was pretty-printed on the way. The signed envelope, as stored in the bucket at
``<bucket>/releases/<name>/manifest.json`` and as the deploy service hands it to robots::

    {"manifest": {"format": 1, "name": "v2", "bucket": "lab/demos", "checkpoint": "hf://...", "created_at": ...,
                  "lineage": {...}, "files": [{"path": "model.safetensors", "size": N, "xet_hash": "...",
                  "sha256": "...", "segments": [{"name": "__header__", "offset": 0, "length": L, "sha256": ...}]}]},
     "key_id": "<16 hex>", "signature": "<base64 ed25519 signature>"}

Segments: a safetensors file is split into its header and one segment per tensor, and so is an ONNX export's weights
file (`policy.onnx.data`: one segment per tensor its graph places there, named as in the graph); other files are one
segment. Robots reuse local segments with the same SHA-256 and fetch only the others (see `store`), so a fine-tune
that leaves the backbone frozen moves only the tensors that changed; and as the exporter writes most tensors' bytes
unchanged, the ONNX weights mostly come from the safetensors file of the same release, not over the network.

Example:
    ```python
    >>> manifest = build_manifest(Path("pretrained_model"), name="v2", bucket="lab/demos", checkpoint=url,
    ...                           xet_hashes={"model.safetensors": "ab12..."})
    >>> signed = SignedManifest.sign(manifest, load_private_key(Path("deploy.key")))
    >>> SignedManifest.from_json(signed.to_json()).verify(trusted_keys)
    ```
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import Unprocessable
from .keys import BadSignature, Signer, verify
from .onnx_runner import ONNX_DATA_FILE, ONNX_FILE

FORMAT = 1
HEADER = "__header__"
RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class BadManifest(Unprocessable, ValueError):
    """A manifest is malformed: missing fields, unsafe paths, a bad release name, sizes that do not add up."""


@dataclass(frozen=True)
class Segment:
    """A byte range of a file, named (a tensor name or ``__header__``) and hashed."""

    name: str
    offset: int
    length: int
    sha256: str


@dataclass(frozen=True)
class ReleaseFile:
    """One file of a release, relative to the release root (the checkpoint's ``pretrained_model/``)."""

    path: str
    size: int
    xet_hash: str
    sha256: str
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Manifest:
    """What a release is: its files and where they came from."""

    name: str
    bucket: str
    checkpoint: str
    created_at: float
    files: tuple[ReleaseFile, ...]
    lineage: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def canonical(self) -> bytes:
        """The bytes that are signed."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Parse and validate.

        Raises:
            BadManifest: a missing or mistyped field, an unknown format, an unsafe file path, segments that do
                not tile the file, or a bad release name.
        """
        try:
            files = tuple(
                ReleaseFile(
                    _text(f["path"]),
                    int(f["size"]),
                    str(f["xet_hash"]),
                    str(f["sha256"]),
                    tuple(
                        Segment(_text(s["name"]), int(s["offset"]), int(s["length"]), str(s["sha256"]))
                        for s in f["segments"]
                    ),
                )
                for f in data["files"]
            )
            lineage = data.get("lineage") or {}
            if not isinstance(lineage, dict) or json_depth(lineage) > MAX_JSON_DEPTH:
                raise ValueError(f"lineage must be a JSON object at most {MAX_JSON_DEPTH} levels deep")
            created_at = float(data["created_at"])
            if not math.isfinite(created_at):
                raise ValueError(f"created_at {created_at} is not a time")
            manifest = cls(
                _text(data["name"]),
                _text(data["bucket"]),
                _text(data["checkpoint"]),
                created_at,
                files,
                dict(lineage),
                int(data.get("format", FORMAT)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise BadManifest(f"malformed release manifest: {type(error).__name__} {error}") from None
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Raises BadManifest (see `from_dict`)."""
        if self.format != FORMAT:
            raise BadManifest(f"release manifest format {self.format}; this robotloop reads format {FORMAT}")
        check_release_name(self.name)
        if not self.files:
            raise BadManifest(f"release {self.name!r} has no files")
        seen = set()
        for f in self.files:
            _check_relative_path(f.path)
            if (key := PurePosixPath(f.path).parts) in seen:  # "a", "a/" and "./a" are one file
                raise BadManifest(f"release {self.name!r}: file {f.path!r} listed twice")
            seen.add(key)
            if len({s.name for s in f.segments}) != len(f.segments):
                raise BadManifest(f"{f.path}: two segments share a name")
            pos = 0
            for s in f.segments:
                if s.offset != pos or s.length < 0:
                    raise BadManifest(f"{f.path}: segment {s.name!r} starts at {s.offset}, expected {pos}")
                pos += s.length
            if pos != f.size:
                raise BadManifest(f"{f.path}: segments cover {pos} bytes of {f.size}")


def check_release_name(name: str) -> str:
    """Raises BadManifest unless `name` is 1-96 of [A-Za-z0-9._-], starting with a letter or digit."""
    if not isinstance(name, str) or not RELEASE_NAME.match(name):
        raise BadManifest(
            f"bad release name {name!r}: use 1-96 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def _check_relative_path(path: str) -> None:
    parts = path.split("/")  # PurePosixPath would drop the "." and "" parts this refuses
    if not path or path.startswith("/") or "\\" in path or any(p in ("..", ".", "") for p in parts):
        raise BadManifest(f"unsafe file path in manifest: {path!r}")


MAX_JSON_DEPTH = 32  # what the services store and serve back: pydantic's encoder gives up far deeper, FastAPI too


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of a JSON value (a scalar is 0), counted without recursion and up to `limit` + 1 at most."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            deepest = max(deepest, depth + 1)
            stack.append((child, depth + 1))
    return deepest


def _text(value: object) -> str:
    """A manifest's names and paths are strings; anything else is a malformed manifest, not a crash."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class SignedManifest:
    """A manifest with the ed25519 signature over its canonical bytes."""

    manifest: Manifest
    key_id: str
    signature: str  # base64

    @classmethod
    def sign(cls, manifest: Manifest, signer: Signer) -> SignedManifest:
        manifest.validate()
        return cls(manifest, signer.key_id, base64.b64encode(signer.sign(manifest.canonical())).decode())

    def verify(self, trusted: dict, who: str = "this robot") -> Manifest:
        """The manifest, if signed by a key `who` (a robot, the deploy service) trusts.

        Raises:
            BadSignature: untrusted key or a signature that does not verify (the manifest was altered).
        """
        try:
            signature = base64.b64decode(self.signature, validate=True)
        except ValueError:
            raise BadSignature("the manifest's signature is not base64") from None
        verify(trusted, self.key_id, signature, self.manifest.canonical(), who)
        return self.manifest

    def to_dict(self) -> dict[str, Any]:
        return {"manifest": asdict(self.manifest), "key_id": self.key_id, "signature": self.signature}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SignedManifest:
        """Raises BadManifest: not a signed manifest envelope, or a malformed manifest."""
        if not isinstance(data, dict) or not {"manifest", "key_id", "signature"} <= data.keys():
            raise BadManifest("not a signed release manifest: expected keys manifest, key_id, signature")
        return cls(Manifest.from_dict(data["manifest"]), str(data["key_id"]), str(data["signature"]))

    @classmethod
    def from_json(cls, raw: bytes | str) -> SignedManifest:
        """Raises BadManifest: not JSON, or see `from_dict`."""
        try:
            data = json.loads(raw)
        except ValueError as error:
            raise BadManifest(f"release manifest is not JSON: {error}") from None
        return cls.from_dict(data)


# -- building --------------------------------------------------------------------------------------------
def build_manifest(
    root: Path,
    name: str,
    bucket: str,
    checkpoint: str,
    xet_hashes: dict[str, str],
    lineage: dict[str, Any] | None = None,
) -> Manifest:
    """The manifest of the files under `root` (e.g. a downloaded ``pretrained_model/``).

    `xet_hashes` maps each relative path to the Xet hash the bucket holds for it (robots fetch by that hash).

    Raises:
        BadManifest: a file under `root` has no Xet hash, or `name` is bad.
    """
    files = []
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in xet_hashes:
            raise BadManifest(f"{rel}: no Xet hash for this file (is it in the bucket?)")
        segments, digest = file_segments(path)
        files.append(ReleaseFile(rel, path.stat().st_size, xet_hashes[rel], digest, segments))
    manifest = Manifest(check_release_name(name), bucket, checkpoint, time.time(), tuple(files), lineage or {})
    manifest.validate()
    return manifest


def file_segments(path: Path) -> tuple[tuple[Segment, ...], str]:
    """Segments of a file (header + tensors for safetensors, tensors for an ONNX export's weights file, else the
    whole file) and its SHA-256."""
    size = Path(path).stat().st_size
    if path.suffix == ".safetensors":
        bounds = _safetensors_bounds(path, size)
    elif path.name == ONNX_DATA_FILE:
        bounds = _onnx_data_bounds(path.with_name(ONNX_FILE), path.name, size)
    else:
        bounds = None
    bounds = bounds or [("__file__", 0, size)]
    whole = hashlib.sha256()
    segments = []
    with open(path, "rb") as f:
        for seg_name, offset, length in bounds:
            f.seek(offset)
            data = f.read(length)
            whole.update(data)
            segments.append(Segment(seg_name, offset, length, hashlib.sha256(data).hexdigest()))
    return tuple(segments), whole.hexdigest()


def _safetensors_bounds(path: Path, size: int) -> list[tuple[str, int, int]] | None:
    """(name, offset, length) of the header and of each tensor, in file order; None if not safetensors-shaped."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            return None
        try:
            header = json.loads(f.read(header_len))
        except ValueError:
            return None
    base = 8 + header_len
    tensors = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__")
    out, pos = [(HEADER, 0, base)], base
    for start, end, tensor in tensors:
        if base + start != pos:  # gaps or overlaps: not a layout we can tile, so treat as one blob
            return None
        out.append((tensor, pos, end - start))
        pos = base + end
    return out if pos == size else None


def _onnx_data_bounds(graph: Path, data_name: str, size: int) -> list[tuple[str, int, int]] | None:
    """(name, offset, length) of each tensor the ONNX graph in `graph` keeps in its external data file `data_name`,
    in file order, with padding between them as segments of their own; None when there is no such graph, the `onnx`
    package is not installed (a robot never builds manifests), or its tensors do not tile the file."""
    try:
        import onnx
    except ImportError:
        return None
    if not graph.is_file():
        return None
    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a readable graph (protobuf's DecodeError, ...): one segment, as any file
        return None
    tensors = []
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = {entry.key: entry.value for entry in tensor.external_data}
        if where.get("location") != data_name or "length" not in where:
            return None
        tensors.append((int(where.get("offset", 0)), int(where["length"]), tensor.name))
    out, pos = [], 0
    for offset, length, name in sorted(tensors):
        if offset < pos:  # overlaps: not a layout to tile
            return None
        if offset > pos:  # alignment padding
            out.append((f"__padding_{pos}__", pos, offset - pos))
        out.append((name, offset, length))
        pos = offset + length
    if pos > size or len({name for name, _, _ in out}) != len(out):
        return None
    if pos < size:
        out.append((f"__padding_{pos}__", pos, size - pos))
    return out
