"""The robot's local release store: verified releases, and staged downloads that survive a crash.

Layout under `root`::

    releases/<name>/manifest.json         the signed manifest, as verified
    releases/<name>/model/<files>         the checkpoint's pretrained_model files (what `PolicyRunner.load` reads)
    staging/<name>/parts/<file>_<start>_<end>   fetched byte ranges; each is renamed into place once complete
    staging/<name>/release/               the release being assembled; renamed to releases/<name> when verified

A pull verifies the manifest's signature before fetching anything. Segments (tensors) whose SHA-256 matches
one of an installed release, or of a file of the same release assembled before (an ONNX export's weights are
mostly the safetensors' tensors), are copied locally, the rest is fetched by byte range through hf_xet in pieces
of at most `PIECE_BYTES`, and every file is checked (size, SHA-256 of each segment and of the file, and its
Xet hash recomputed locally) before the one atomic rename that makes the release visible. A crash mid-pull
leaves only `staging/`, which the next pull resumes; a partial file is never under `releases/`. A cancelled
pull (`cancelled()` answering True, e.g. the robot stopping) ends the same way, within one transfer block.

Example:
    ```python
    >>> store = ReleaseStore(Path("/var/lib/robotloop/releases"))
    >>> report = store.pull(signed, trusted_keys, XetFetcher(endpoint, token, signed.manifest.bucket))
    >>> report.bytes_fetched, store.model_dir("v2")
    ```
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import Refused, Unavailable
from ..storage.private import private_dir
from .client import DeployClient
from .fetch import XetFetcher
from .keys import BadSignature
from .manifest import RELEASE_NAME, Manifest, ReleaseFile, Segment, SignedManifest, check_release_name

log = logging.getLogger(__name__)

PIECE_BYTES = 16 * 2**20  # resume granularity: a crash loses at most one piece in flight


class IntegrityError(Refused, RuntimeError):
    """Downloaded or stored bytes do not match the signed manifest (tampered, corrupted or truncated)."""


class PullCancelled(Unavailable, RuntimeError):
    """The pull was asked to stop (the robot is shutting down); its complete pieces stay staged for the next."""


@dataclass(frozen=True)
class PullReport:
    """What a pull moved: bytes fetched over the network, bytes reused from installed releases (or from files of
    the same release assembled before), bytes resumed from a previous interrupted pull's staged pieces."""

    name: str
    bytes_total: int
    bytes_fetched: int
    bytes_reused: int
    bytes_resumed: int
    seconds: float


@dataclass(frozen=True)
class _Source:
    path: Path
    offset: int


class ReleaseStore:
    """Releases on the robot's disk (see the module docstring for the layout and the guarantees)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        private_dir(self.root)
        (self.root / "releases").mkdir(exist_ok=True)
        (self.root / "staging").mkdir(exist_ok=True)

    def release_dir(self, name: str) -> Path:
        return self.root / "releases" / check_release_name(name)

    def model_dir(self, name: str) -> Path:
        return self.release_dir(name) / "model"

    def installed(self) -> list[str]:
        """Releases in the store (a leftover of an interrupted removal, `.trash-*`, is not one)."""
        return sorted(
            p.name
            for p in (self.root / "releases").iterdir()
            if RELEASE_NAME.match(p.name) and (p / "manifest.json").is_file()
        )

    def has(self, name: str) -> bool:
        return (self.release_dir(name) / "manifest.json").is_file()

    # -- pulling ---------------------------------------------------------------------------------------------
    def pull(
        self,
        signed: SignedManifest,
        trusted: dict,
        fetcher: XetFetcher,
        on_piece: Callable[[str, int, int], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> PullReport:
        """Install the release `signed` describes, fetching only what no installed release already holds.

        `on_piece(path, start, end)` is called after each fetched piece is safely on disk (progress).
        `cancelled()` is asked between the blocks of a transfer; once it answers True the pull stops.

        Raises:
            BadSignature: the manifest is not signed by a trusted key (nothing is fetched).
            IntegrityError: fetched bytes do not match the manifest (the staged pieces are dropped).
            StorageError: a transfer failed; staged pieces are kept and the next pull resumes.
            PullCancelled: `cancelled()` said so; staged pieces are kept and the next pull resumes.
        """
        manifest = signed.verify(trusted)
        t0 = time.monotonic()
        if self.has(manifest.name):
            try:
                if self.verify(manifest.name, trusted).canonical() == manifest.canonical():
                    return PullReport(manifest.name, manifest.total_bytes, 0, manifest.total_bytes, 0, 0.0)
                log.warning(
                    "%s: the installed copy is another release of that name; pulling the assigned one", manifest.name
                )
            except (IntegrityError, BadSignature) as error:  # a flipped bit, a rotated key: fetch it again
                log.warning("%s: the installed copy fails verification (%s); pulling it again", manifest.name, error)
            self.remove(manifest.name)
        staging = self.root / "staging" / manifest.name
        parts, out = staging / "parts", staging / "release"
        parts.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)  # assembled files are cheap to redo; pieces are what we keep
        (out / "model").mkdir(parents=True)
        local = self._local_segments(exclude=manifest.name)
        fetched = reused = resumed = 0
        for index, entry in enumerate(manifest.files):
            counts = self._assemble(entry, index, local, parts, out / "model", fetcher, on_piece, cancelled)
            fetched, reused, resumed = fetched + counts[0], reused + counts[1], resumed + counts[2]
            # A file assembled (and verified) serves the later files of the same release: an ONNX export's weights
            # are mostly the safetensors' tensors, byte for byte, and travel once.
            for segment in entry.segments:
                local.setdefault(segment.sha256, _Source(out / "model" / entry.path, segment.offset))
        (out / "manifest.json").write_bytes(signed.to_json())
        os.replace(out, self.release_dir(manifest.name))  # the one step that makes the release visible
        shutil.rmtree(staging, ignore_errors=True)
        report = PullReport(manifest.name, manifest.total_bytes, fetched, reused, resumed, time.monotonic() - t0)
        log.info(
            "release %s installed: %.1f MB fetched, %.1f MB reused, %.1f MB resumed, in %.1f s",
            manifest.name,
            fetched / 1e6,
            reused / 1e6,
            resumed / 1e6,
            report.seconds,
        )
        return report

    def _assemble(
        self,
        entry: ReleaseFile,
        index: int,
        local: dict[str, _Source],
        parts: Path,
        out: Path,
        fetcher: XetFetcher,
        on_piece,
        cancelled: Callable[[], bool],
    ) -> tuple[int, int, int]:
        """Write one file from local segments and fetched pieces, verified. Returns (fetched, reused, resumed)."""
        reuse = {
            s.name: local[s.sha256] for s in entry.segments if s.sha256 in local and _segment_ok(local[s.sha256], s)
        }
        missing = [s for s in entry.segments if s.name not in reuse]
        fetched = resumed = 0
        pieces = _plan(_ranges(missing), _staged(parts, index))
        for start, end, staged in pieces:
            if staged:
                resumed += end - start
                continue
            piece = parts / f"{index}_{start}_{end}"
            tmp = piece.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                for block in fetcher.stream(entry.xet_hash, entry.size, start, end):
                    if stopped := cancelled():
                        break
                    f.write(block)
                else:
                    stopped = False  # a piece that finished is kept, even if the stop came right after it
            if stopped:
                tmp.unlink()
                raise PullCancelled(f"{parts.parent.name}: pull stopped in {entry.path}; complete pieces stay staged")
            if tmp.stat().st_size != end - start:
                tmp.unlink()
                raise IntegrityError(f"{entry.path}: asked bytes {start}-{end}, got a different length")
            os.replace(tmp, piece)
            fetched += end - start
            if on_piece:
                on_piece(entry.path, start, end)
        target = out / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        whole = hashlib.sha256()
        with open(target, "wb") as f:
            for segment in entry.segments:
                if segment.name in reuse:
                    data = _read(reuse[segment.name], segment.length)
                else:
                    data = _from_pieces(parts, index, pieces, segment)
                if hashlib.sha256(data).hexdigest() != segment.sha256:
                    _drop_pieces(parts, index)
                    raise IntegrityError(
                        f"{entry.path}: segment {segment.name!r} does not match the signed "
                        "manifest; the fetched bytes were dropped"
                    )
                whole.update(data)
                f.write(data)
        _check_file(target, entry, whole.hexdigest())
        reused = sum(s.length for s in entry.segments if s.name in reuse)
        return fetched, reused, resumed

    def _local_segments(self, exclude: str) -> dict[str, _Source]:
        """SHA-256 -> where that segment lies in an installed release (which was verified when installed)."""
        out: dict[str, _Source] = {}
        for name in self.installed():
            if name == exclude:
                continue
            try:
                manifest = SignedManifest.from_json((self.release_dir(name) / "manifest.json").read_bytes()).manifest
            except ValueError:
                continue
            for f in manifest.files:
                for s in f.segments:
                    out.setdefault(s.sha256, _Source(self.model_dir(name) / f.path, s.offset))
        return out

    # -- checking and pruning ----------------------------------------------------------------------------------
    def verify(self, name: str, trusted: dict) -> Manifest:
        """Re-check an installed release before loading it: signature, then size and SHA-256 of every file.

        Raises:
            FileNotFoundError: not installed. BadSignature: untrusted or altered manifest.
            IntegrityError: a file is missing, or its bytes changed on disk.
        """
        manifest = SignedManifest.from_json((self.release_dir(name) / "manifest.json").read_bytes()).verify(trusted)
        for entry in manifest.files:
            path = self.model_dir(name) / entry.path
            if not path.is_file():
                raise IntegrityError(f"release {name}: {entry.path} is missing from {path.parent}")
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
            if path.stat().st_size != entry.size or digest.hexdigest() != entry.sha256:
                raise IntegrityError(f"release {name}: {entry.path} changed on disk since it was verified")
        return manifest

    def remove(self, name: str) -> None:
        """Delete an installed release (its segments stop being reusable) and any staged pull of it."""
        for path in (self.release_dir(name), self.root / "staging" / name):
            if path.exists():
                trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
                os.replace(path, trash)  # atomic: never a half-deleted release under its name
                shutil.rmtree(trash, ignore_errors=True)

    def prune(self, keep: set[str], max_releases: int = 3) -> list[str]:
        """Remove the oldest installed releases beyond `max_releases`, never one in `keep`. Returns the removed."""
        by_age = sorted(self.installed(), key=lambda n: (self.release_dir(n) / "manifest.json").stat().st_mtime)
        removed = []
        for name in by_age:
            if len(by_age) - len(removed) <= max_releases:
                break
            if name not in keep:
                self.remove(name)
                removed.append(name)
        return removed


def _segment_ok(source: _Source, segment: Segment) -> bool:
    # A local copy that no longer hashes right (disk corruption, a hand edit) is fetched instead.
    try:
        return hashlib.sha256(_read(source, segment.length)).hexdigest() == segment.sha256
    except OSError:
        return False


def _read(source: _Source, length: int) -> bytes:
    with open(source.path, "rb") as f:
        f.seek(source.offset)
        return f.read(length)


def _ranges(segments: list[Segment]) -> list[tuple[int, int]]:
    """Contiguous runs of segments as [start, end) byte ranges."""
    out: list[tuple[int, int]] = []
    for s in segments:
        if out and out[-1][1] == s.offset:
            out[-1] = (out[-1][0], s.offset + s.length)
        elif s.length:
            out.append((s.offset, s.offset + s.length))
    return out


def _staged(parts: Path, index: int) -> dict[int, int]:
    """Complete pieces of file `index` left by an earlier pull: start -> end (a .tmp piece is never complete)."""
    out = {}
    for piece in parts.glob(f"{index}_*_*"):
        if piece.suffix != ".tmp":
            _, start, end = (int(v) for v in piece.name.split("_"))
            if piece.stat().st_size == end - start:
                out[start] = end
    return out


def _plan(ranges: list[tuple[int, int]], staged: dict[int, int]) -> list[tuple[int, int, bool]]:
    """Cover `ranges` with staged pieces where they fit and new pieces of at most PIECE_BYTES elsewhere."""
    out = []
    for start, end in ranges:
        pos = start
        while pos < end:
            if pos in staged and staged[pos] <= end:
                out.append((pos, staged[pos], True))
                pos = staged[pos]
                continue
            nxt = min([s for s in staged if pos < s < end] + [end, pos + PIECE_BYTES])
            out.append((pos, nxt, False))
            pos = nxt
    return out


def _from_pieces(parts: Path, index: int, pieces: list[tuple[int, int, bool]], segment: Segment) -> bytes:
    """A segment's bytes out of the pieces of file `index` that this pull uses (a segment may span several)."""
    out, want_start, want_end = [], segment.offset, segment.offset + segment.length
    for start, end, _ in pieces:
        lo, hi = max(start, want_start), min(end, want_end)
        if lo < hi:
            with open(parts / f"{index}_{start}_{end}", "rb") as f:
                f.seek(lo - start)
                out.append(f.read(hi - lo))
    return b"".join(out)


def _drop_pieces(parts: Path, index: int) -> None:
    for piece in parts.glob(f"{index}_*"):
        piece.unlink(missing_ok=True)


def _check_file(path: Path, entry: ReleaseFile, sha256: str) -> None:
    import hf_xet

    if path.stat().st_size != entry.size or sha256 != entry.sha256:
        raise IntegrityError(f"{entry.path}: size or SHA-256 differs from the signed manifest")
    xet = hf_xet.hash_files([str(path)])[0].hash  # the Xet hash, recomputed here: what the bucket was asked for
    if xet != entry.xet_hash:
        raise IntegrityError(
            f"{entry.path}: Xet hash {xet[:12]} differs from the signed manifest's {entry.xet_hash[:12]}"
        )


def pull_release(
    name: str, deploy: DeployClient, fetcher_for: Callable[[str], XetFetcher], trusted: dict, store: ReleaseStore
) -> Path:
    """The model directory of release `name`, exactly as robots run it: its manifest from the deploy service,
    signature checked against `trusted`, files pulled into `store` with every hash checked.

    Example:
        ```python
        >>> model = pull_release("cube-v3", DeployClient(url, token), lambda b: XetFetcher(endpoint, tok, b),
        ...                      load_public_keys([key]), ReleaseStore(Path("releases")))
        ```

    Raises:
        DeployError: no such release (404) or the service refused. BadSignature: not signed by a trusted key.
        IntegrityError: fetched bytes do not match the manifest.
    """
    signed = SignedManifest.from_dict(deploy.release(name)["manifest"])
    store.pull(signed, trusted, fetcher_for(signed.manifest.bucket))
    return store.model_dir(name)
