"""The one way robotloop reads and writes buckets.

Everything goes through `huggingface_hub` (bucket API, HfFileSystem) and `hf_xet`, so the same code
talks to the public Hub and to robotloop's own bucket server; only the endpoint differs.

Example:
    ```python
    >>> from robotloop.storage import connect, BucketUrl
    >>> client = connect()                      # embedded bucket server unless one is configured
    >>> url = BucketUrl.parse("hf://buckets/lab/demos/notes.txt")
    >>> client.create_bucket(url)
    >>> report = client.upload("notes.txt", url)
    >>> report.bytes_new, report.bytes_deduplicated
    (1234, 0)
    ```
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import httpx
from huggingface_hub import HfApi, HfFileSystem
from huggingface_hub.errors import BucketNotFoundError, EntryNotFoundError, HfHubHTTPError
from huggingface_hub.utils import build_hf_headers

from .. import errors
from ..compat import BucketAddFile, BucketFile, xet_refresh_url, xet_session
from ..errors import BadInput, Conflict, MissingFile, Refused, RobotloopError, Unavailable, category_of_status
from .cache import ReadCache
from .urls import BucketUrl


class StorageError(RobotloopError, RuntimeError):
    """A bucket operation failed; the message names the bucket, the path and what to do."""


class NotFound(StorageError, errors.NotFound, FileNotFoundError):
    """The bucket or the path does not exist."""


class StorageUnavailable(StorageError, Unavailable):
    """The storage endpoint does not answer (nothing listens there, DNS, TLS, a timeout), or answers that it cannot
    serve now (5xx)."""


class StorageRefused(StorageError, Refused):
    """The bucket server refused the token: missing or unknown (401), or not allowed to do this (403)."""


class StorageConflict(StorageError, Conflict):
    """The request clashes with what the bucket holds (409): a file under a path that is a file, a file where a
    folder is."""


class StorageBadInput(StorageError, BadInput):
    """The bucket server found the request itself wrong (400, 413, 422: a bad path, a batch it cannot apply)."""


class NotAFolder(BadInput, NotADirectoryError):
    """A download into a folder was given a file."""


@dataclass(frozen=True)
class FileUpload:
    """Figures for one uploaded file: how many of its bytes were new to the store, how many deduplicated."""

    path: str
    size: int
    xet_hash: str
    bytes_new: int
    bytes_deduplicated: int


@dataclass
class UploadReport:
    """Figures for one upload call. `bytes_sent` is what went over the wire (xorbs and shards)."""

    files: list[FileUpload] = field(default_factory=list)
    bytes_sent: int = 0

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bytes_new(self) -> int:
        return sum(f.bytes_new for f in self.files)

    @property
    def bytes_deduplicated(self) -> int:
        return sum(f.bytes_deduplicated for f in self.files)


class TransferProgress(Protocol):
    """Where an upload or download reports how far it got (the CLI draws a bar from it): the files' total size
    once it is known, then bytes done as hf_xet reports them, from hf_xet's own thread (a file from the read
    cache all at once)."""

    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class _XetReports:
    """hf_xet's `progress_callback` for the upload commits or download groups of one transfer, one after another:
    hf_xet reports each group's running total, this passes on to `progress` what was done since its last report.
    `base`: the bytes of the groups before the current one."""

    def __init__(self, progress: TransferProgress | None) -> None:
        self.progress, self.base, self.done, self._lock = progress, 0, 0, threading.Lock()

    def __call__(self, group, _items) -> None:
        # Files written (downloads) lag the bytes received by seconds, in jumps; files read (uploads) lead the
        # bytes sent. The further of the two, the transfer's share of the files' bytes, moves most evenly.
        moved = group.total_transfer_bytes_completed / group.total_transfer_bytes if group.total_transfer_bytes else 0
        self.to(self.base + max(group.total_bytes_completed, int(moved * group.total_bytes)))

    def to(self, done: int) -> None:
        """Advance to `done` bytes (after a group: its end, which its last report may not have reached)."""
        with self._lock:
            if done > self.done:
                if self.progress is not None:
                    self.progress.advance(done - self.done)
                self.done = done


@dataclass(frozen=True)
class Entry:
    """A file in a bucket; `uploaded_at` (unix seconds) where the listing says (not part of its identity)."""

    url: BucketUrl
    size: int
    xet_hash: str
    uploaded_at: float | None = field(default=None, compare=False)


class BucketClient:
    """Reads and writes buckets at one endpoint with one token, through huggingface_hub and hf_xet.

    Example:
        ```python
        >>> client = BucketClient("http://127.0.0.1:8750", token, ReadCache(Path("~/.cache/rl").expanduser(), 2**30))
        >>> url = BucketUrl.parse("hf://buckets/lab/demos/runs/1")
        >>> client.create_bucket(url)
        >>> client.upload(Path("ep"), url).bytes_new       # only chunks the store lacks travel
        >>> [e.url.name for e in client.ls(url)]
        ```

    Every method raises `StorageError` (its message names the URL and what to do) when the endpoint does not
    answer, the token may not do it, or the server refuses; `NotFound` (a StorageError and a FileNotFoundError)
    for a missing bucket or file. Use `robotloop.storage.connect()` to get one from the settings.
    """

    def __init__(self, endpoint: str, token: str | None, cache: ReadCache | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self.cache = cache
        self.downloads = CachedDownloads(self)

    # -- buckets ---------------------------------------------------------------------------------------
    def create_bucket(self, url: BucketUrl, private: bool = True) -> None:
        """Create the bucket of `url` if it does not exist. Buckets are private unless asked otherwise."""
        with _explained(BucketUrl(url.bucket_id, ""), "create the bucket"):  # the bucket's URL, not a file's
            self.api.create_bucket(url.bucket_id, private=private, exist_ok=True)

    def list_buckets(self, namespace: str) -> list[dict]:
        """The buckets of `namespace` this token may see: id, private, size, total_files (as `hf buckets list`).

        Raises:
            StorageError: the server cannot be reached or refuses the token.
        """
        with _explained(BucketUrl(f"{namespace}/-", ""), "list the buckets"):
            infos = self.api.list_buckets(namespace)
            return [{"id": b.id, "private": b.private, "size": b.size, "total_files": b.total_files} for b in infos]

    def delete_bucket(self, url: BucketUrl) -> None:
        """Delete the bucket of `url` and every file in it (for good: buckets have no trash).

        Raises:
            NotFound: no such bucket. StorageError: the token may not delete it, or the server refuses.
        """
        with _explained(BucketUrl(url.bucket_id, ""), "delete the bucket"):
            self.api.delete_bucket(url.bucket_id)

    # -- writes ----------------------------------------------------------------------------------------
    def point_back(self, bucket: BucketUrl, files: dict[str, str | None]) -> None:
        """Point bucket paths (relative to the bucket's root) at Xet hashes the bucket holds or held before, in one
        batch; None deletes the path. Nothing moves but metadata: the bytes are still in the store. How a writer
        undoes the part of a change it uploaded when the rest failed, and how a release keeps paths of its own to
        its files.

        Raises:
            StorageError: the batch was refused (e.g. a hash this bucket never held).
        """
        root = BucketUrl(bucket.bucket_id, "")
        # An add with a known hash uploads nothing: it only registers the path (a copy would need the bucket to
        # still hold a file with that hash, and the path being restored was just overwritten).
        adds = [BucketAddFile(source=b"", destination=path, xet_hash=h) for path, h in files.items() if h is not None]
        deletes = [path for path, h in files.items() if h is None]
        with _explained(root, "restore files in"):
            self.api.batch_bucket_files(bucket.bucket_id, add=adds or None, delete=deletes or None)

    def upload(self, local: str | Path, url: BucketUrl, progress: TransferProgress | None = None) -> UploadReport:
        """Upload a file, or a folder recursively, to `url`; all files appear in one batch.

        As `cp` does: a file uploaded to a folder that exists goes into it (`url/<name>`), never beside it as a
        file of the folder's name. Only chunks the store lacks travel (Xet dedup); the report says how many bytes
        that was. `progress` hears the upload's size, then hf_xet's reports of the bytes it has read and chunked.

        Raises:
            FileNotFoundError: `local` does not exist.
            NotFound: the bucket does not exist (create it first).
            StorageConflict: `url` is a file and `local` a folder, or a file would go under a file of the bucket, or
                where files are under its path (the server refuses a path that is both a file and a folder).
            StorageRefused: the token may not write there. StorageError: the server refused the upload otherwise
                (the message says why).
        """
        local = Path(local)
        if url.path and local.exists():
            url = self._destination(local, url)
        pairs = _files_to_upload(local, url)
        report = UploadReport()
        if not pairs:
            return report
        if progress is not None:
            progress.start(sum(src.stat().st_size for src, _ in pairs))
        with _explained(url, "upload"):
            report = self._xet_upload(pairs, url, _XetReports(progress))
            adds = [
                BucketAddFile(source=src, destination=dst.path, xet_hash=f.xet_hash, size=f.size)
                for (src, dst), f in zip(pairs, report.files, strict=True)
            ]
            self.api.batch_bucket_files(url.bucket_id, add=adds)
        return report

    def _destination(self, local: Path, url: BucketUrl) -> BucketUrl:
        """Where `local` goes, given what the bucket holds at `url` (one listing: a file lists as itself)."""
        found = self.ls(url)
        is_file = len(found) == 1 and isinstance(found[0], Entry) and found[0].url.path == url.path
        if is_file and local.is_dir():
            raise StorageConflict(f"{url} is a file: folder {local} cannot be uploaded under it. Choose another path")
        if found and not is_file and local.is_file():
            return url / local.name
        return url

    def _xet_upload(self, pairs: list[tuple[Path, BucketUrl]], url: BucketUrl, reports: _XetReports) -> UploadReport:
        # huggingface_hub's batch_bucket_files uploads too, but keeps the dedup figures (and the progress reports,
        # which it draws as tqdm bars) to itself; driving the same hf_xet session here gives them to us, and the
        # batch then only registers the hashes.
        refresh_url = xet_refresh_url(url.bucket_id, self.endpoint, write=True)
        headers = build_hf_headers(token=self.token, library_name="robotloop")
        commit = xet_session().new_upload_commit(
            token_refresh_url=refresh_url, token_refresh_headers=headers, progress_callback=reports
        )
        from hf_xet import SKIP_SHA256

        handles = [commit.start_upload_file(str(src), sha256=SKIP_SHA256) for src, _ in pairs]
        summary = commit.wait_to_finish()
        reports.to(sum(src.stat().st_size for src, _ in pairs))
        files = []
        for (_, dst), handle in zip(pairs, handles, strict=True):
            meta = handle.result()
            m = meta.dedup_metrics
            files.append(
                FileUpload(dst.path, meta.xet_info.file_size, meta.xet_info.hash, m.new_bytes, m.deduped_bytes)
            )
        return UploadReport(files, summary.dedup_metrics.total_bytes_uploaded)

    def delete(self, url: BucketUrl, recursive: bool = False) -> list[str]:
        """Delete the file at `url`, or with `recursive` every file under the folder `url`, in one batch.
        Returns the deleted paths.

        Example:
            ```python
            >>> client.delete(BucketUrl.parse("hf://buckets/lab/demos/scratch"), recursive=True)
            ['scratch/a.bin', 'scratch/b/c.bin']
            ```

        Raises:
            NotFound: nothing at `url`. StorageError: `url` is a folder and `recursive` is off, or the server
                refused (the message says why).
        """
        found = self.ls(url, recursive=recursive) if url.path else []
        paths = [e.url.path for e in found if isinstance(e, Entry)]
        if paths != [url.path] and not recursive and found:
            raise StorageError(f"{url} is a folder: delete it with recursive (CLI: -R)")
        if not paths:
            raise NotFound(
                f"nothing at {url}" if url.path else f"{url}: name a path; a whole bucket is not deleted here"
            )
        with _explained(url, "delete"):
            self.api.batch_bucket_files(url.bucket_id, delete=paths)
        return paths

    # -- reads -----------------------------------------------------------------------------------------
    def ls(self, url: BucketUrl, recursive: bool = False) -> list[Entry | BucketUrl]:
        """Files (as `Entry`) and folders (as `BucketUrl`) under `url`."""
        with _explained(url, "list"):
            tree = self.api.list_bucket_tree(url.bucket_id, prefix=url.path or None, recursive=recursive)
            out: list[Entry | BucketUrl] = []
            for item in tree:
                item_url = BucketUrl(url.bucket_id, item.path)
                out.append(_entry(url.bucket_id, item) if isinstance(item, BucketFile) else item_url)
            return out

    def stat(self, url: BucketUrl) -> Entry:
        """Size and Xet hash of one file.

        Raises:
            NotFound: no file at `url`.
        """
        with _explained(url, "stat"):
            infos = list(self.api.get_bucket_paths_info(url.bucket_id, [url.path]))
        if not infos:
            raise NotFound(
                f"{url}: no such file in bucket '{url.bucket_id}'. List the folder with `robotloop bucket ls`."
            )
        return _entry(url.bucket_id, infos[0])

    def du(self, url: BucketUrl) -> int:
        """Total bytes of the files under `url` (0 for an empty bucket).

        Raises:
            NotFound: nothing at `url` (a mistyped path is not an empty folder: buckets have no empty folders).
        """
        files = [e for e in self.ls(url, recursive=True) if isinstance(e, Entry)]
        if not files and url.path:
            raise NotFound(f"nothing at {url}")
        return sum(e.size for e in files)

    @contextmanager
    def open(self, url: BucketUrl, block_size: int = 8 * 2**20) -> Iterator[IO[bytes]]:
        """A seekable binary file for ranged streaming reads: only the ranges read are fetched.

        Buckets change under readers (episodes land while a trainer reads), so listings are never cached
        across calls: each open sees the bucket as it is now.
        """
        with _explained(url, "open"), self._fresh_fs().open(self._fs_path(url), "rb", block_size=block_size) as f:
            yield f

    def _fresh_fs(self) -> HfFileSystem:
        # HfFileSystem caches listings and "this bucket does not exist" answers for its lifetime, and its
        # invalidate_cache() does not clear the latter; a new instance per read is cheap and never stale.
        return HfFileSystem(endpoint=self.endpoint, token=self.token, skip_instance_cache=True)

    @staticmethod
    def _fs_path(url: BucketUrl) -> str:
        return f"hf://buckets/{url.bucket_id}/{url.path}"

    def read_range(self, url: BucketUrl, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of a file.

        Raises:
            NotFound: no file at `url`.
        """
        with _explained(url, "read"):
            try:
                return self._fresh_fs().cat_file(self._fs_path(url), start=start, end=end)
            except KeyError:
                # HfFileSystem.info looks the file up in its parent's listing and raises KeyError when that listing
                # is missing, which a writer committing into the folder at that moment can cause.
                raise FileNotFoundError(str(url)) from None

    def download(self, src: BucketUrl | Entry, dest: str | Path) -> Path:
        """Download one file to `dest` (a file path, or an existing folder) through the read cache
        (`CachedDownloads.download`). Raises NotFound: no file at `src`."""
        return self.downloads.download(src, dest)

    def fetch(self, url: BucketUrl, dest: str | Path, progress: TransferProgress | None = None) -> list[Path]:
        """Download `url`, a file or a folder, to `dest` (`CachedDownloads.fetch`). Returns the files written
        (empty: nothing there)."""
        return self.downloads.fetch(url, dest, progress)

    def download_tree(
        self,
        url: BucketUrl,
        dest: str | Path,
        entries: list[Entry] | None = None,
        progress: TransferProgress | None = None,
    ) -> list[Path]:
        """Download every file under `url` into folder `dest`, keeping relative paths (`CachedDownloads.download_tree`).
        Raises NotAFolder: `dest` is a file."""
        return self.downloads.download_tree(url, dest, entries, progress)


class CachedDownloads:
    """Owns getting a bucket's files onto local disk: one file, a file or folder, or a listed tree, through the read
    cache (keyed by Xet hash, filled only with bytes that hash to it) so that jobs on one machine fetch a file once.
    Downloads go by the hash the listing gave, through hf_xet, whose progress reports reach a `TransferProgress`."""

    def __init__(self, client: BucketClient) -> None:
        self.client = client

    def download(self, src: BucketUrl | Entry, dest: str | Path) -> Path:
        """Download one file to `dest` (a file path, or an existing folder), through the read cache. `src` is its
        URL, or its `Entry` from `ls` (which saves asking for its size and hash again).

        Raises:
            NotFound: no file at `src`.
        """
        entry = src if isinstance(src, Entry) else self.client.stat(src)
        return self._download(entry, Path(dest), _XetReports(None))

    def _download(self, entry: Entry, dest: Path, reports: _XetReports) -> Path:
        url, cache = entry.url, self.client.cache
        if dest.is_dir():
            dest = dest / url.name
        _make_folder(dest.parent, url)
        cached = cache.get(entry.xet_hash) if cache else None
        if cached is None:
            tmp = Path(tempfile.mkdtemp(dir=dest.parent)) / url.name
            try:
                with _explained(url, "download"):
                    self._xet_download(entry, tmp, reports)
                _check_xet_hash(tmp, entry)  # before the cache, which is keyed by the hash and shared by every job
                if cache:
                    cache.put(entry.xet_hash, tmp)  # a copy: the download itself becomes `dest`
                os.replace(tmp, dest)
                return dest
            finally:
                tmp.unlink(missing_ok=True)
                tmp.parent.rmdir()
        _copy_out(cached, dest)
        reports.to(reports.done + entry.size)  # from the cache: all at once
        return dest

    def _xet_download(self, entry: Entry, dest: Path, reports: _XetReports) -> None:
        # What huggingface_hub's download_bucket_files does for one file (an hf_xet download group, by the hash
        # listed), with hf_xet's progress reports passed on instead of drawn as tqdm bars.
        import hf_xet

        if entry.size == 0:  # nothing to reconstruct (huggingface_hub writes empty files itself too)
            dest.write_bytes(b"")
            return
        refresh_url = xet_refresh_url(entry.url.bucket_id, self.client.endpoint, write=False)
        headers = build_hf_headers(token=self.client.token, library_name="robotloop")
        reports.base = reports.done
        with xet_session().new_file_download_group(
            token_refresh_url=refresh_url, token_refresh_headers=headers, progress_callback=reports
        ) as group:
            handle = group.start_download_file(hf_xet.XetFileInfo(entry.xet_hash, entry.size), str(dest))
        handle.result()
        reports.to(reports.base + entry.size)

    def fetch(self, url: BucketUrl, dest: str | Path, progress: TransferProgress | None = None) -> list[Path]:
        """Download `url`, a file or a folder, to `dest`. Returns the files written (empty: nothing there).
        `progress` hears the download's size, then hf_xet's reports of the bytes written."""
        if url.path:
            try:
                entry = self.client.stat(url)
            except NotFound:
                entry = None  # not a file: a folder, or nothing
            if entry is not None:
                if progress is not None:
                    progress.start(entry.size)
                return [self._download(entry, Path(dest), _XetReports(progress))]
        return self.download_tree(url, dest, progress=progress)

    def download_tree(
        self,
        url: BucketUrl,
        dest: str | Path,
        entries: list[Entry] | None = None,
        progress: TransferProgress | None = None,
    ) -> list[Path]:
        """Download every file under `url` into folder `dest`, keeping relative paths. `entries`: the files under
        `url` as a recursive `ls` already listed them (not listed again). `progress`: as `fetch`'s.

        Raises:
            NotAFolder: `dest` is a file, or a file on disk is where a folder of the tree goes.
            StorageConflict: the listing holds a file and files under it (`a` and `a/b`), which no folder on disk
                can hold both of (the public Hub's buckets may; a robotloop bucket server refuses to make one).
        """
        if Path(dest).is_file():
            raise NotAFolder(f"{dest} is a file: give a folder to download {url} into")
        if entries is None:
            entries = [e for e in self.client.ls(url, recursive=True) if isinstance(e, Entry)]
        relative = [(entry, entry.url.path[len(url.path) :].lstrip("/") or entry.url.name) for entry in entries]
        _refuse_file_and_folder(url, dest, [rel for _, rel in relative])
        if progress is not None:
            progress.start(sum(e.size for e in entries))
        reports = _XetReports(progress)
        return [self._download(entry, Path(dest) / rel, reports) for entry, rel in relative]


def _refuse_file_and_folder(url: BucketUrl, dest: str | Path, paths: list[str]) -> None:
    """Raises StorageConflict, before anything is written, when one of `paths` (relative, '/'-separated) is a folder
    of another: the tree cannot be laid out on disk."""
    files = set(paths)
    for path in paths:
        parts = path.split("/")
        above = next((a for a in ("/".join(parts[:i]) for i in range(1, len(parts))) if a in files), None)
        if above is not None:
            raise StorageConflict(
                f"cannot download {url} to {dest}: {url / above} is a file and {url / path} is under it; a folder "
                f"on disk cannot be both. Download one of them alone (`robotloop bucket get {url / path} FILE`)"
            )


def _make_folder(folder: Path, url: BucketUrl) -> None:
    """Make `folder` and its parents for the download of `url`. Raises NotAFolder: a file on disk is in the way."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        raise NotAFolder(f"cannot download {url} to {folder}: {blocker} is a file, not a folder") from None


def _entry(bucket_id: str, item: BucketFile) -> Entry:
    uploaded = getattr(item, "uploaded_at", None)
    return Entry(BucketUrl(bucket_id, item.path), item.size, item.xet_hash, uploaded.timestamp() if uploaded else None)


def _files_to_upload(local: Path, url: BucketUrl) -> list[tuple[Path, BucketUrl]]:
    if local.is_file():
        return [(local, url if url.path else url / local.name)]
    if not local.is_dir():
        raise MissingFile(f"{local}: no such file or folder to upload to {url}.")
    return [(p, url / p.relative_to(local).as_posix()) for p in sorted(local.rglob("*")) if p.is_file()]


def _check_xet_hash(path: Path, entry: Entry) -> None:
    """Raises StorageError unless `path` hashes to `entry`'s Xet hash (hf_xet hashes ~1 GB/s): a server, or a file
    rewritten since it was listed, cannot put other bytes under a hash into the read cache."""
    import hf_xet

    got = hf_xet.hash_files([str(path)])[0].hash
    if got != entry.xet_hash:
        raise StorageError(
            f"{entry.url}: the downloaded bytes hash to {got[:12]}…, not the listed {entry.xet_hash[:12]}…"
            " (changed since it was listed, or a misbehaving server); nothing was kept"
        )


def _copy_out(src: Path, dest: Path) -> None:
    """Copy a cache entry to `dest` through a temp file, so `dest` never holds part of a file. A copy, never a hard
    link: a user editing a downloaded file (or a writer growing one in place) would change the cached bytes under
    their hash for every later reader. Where the file system shares blocks (btrfs, XFS) the copy is a reflink and
    costs nothing; elsewhere the kernel copies it."""
    import shutil

    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{threading.get_ident()}.tmp")  # per thread: readers race
    try:
        if not _reflink(src, tmp):
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _reflink(src: Path, dest: Path) -> bool:
    """Clone `src` into `dest` sharing its blocks (Linux FICLONE); False where the file system cannot."""
    import fcntl

    ficlone = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
    with open(src, "rb") as s, open(dest, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), ficlone, s.fileno())
            return True
        except OSError:
            return False


@contextmanager
def _explained(url: BucketUrl, action: str) -> Iterator[None]:
    """Turn huggingface_hub's, httpx's and hf_xet's errors into one-line ones that name the bucket, the path and what
    to do, filed under the category of the server's answer (`robotloop.errors.category_of_status`, as the service
    clients do): a 401 or 403 is a `StorageRefused`, a 404 a `NotFound`, a 409 a `StorageConflict`."""
    try:
        yield
    except StorageError:
        raise
    except BucketNotFoundError:
        raise NotFound(
            f"cannot {action} {url}: bucket '{url.bucket_id}' does not exist or this token cannot see it. "
            f"Create it with `robotloop bucket create hf://buckets/{url.bucket_id}` or check the token."
        ) from None
    except EntryNotFoundError:
        raise NotFound(f"cannot {action} {url}: no such file.") from None
    except FileNotFoundError as error:
        raise NotFound(f"cannot {action} {url}: no such file ({_one_line(str(error))}).") from None
    except (HfHubHTTPError, httpx.HTTPStatusError) as error:
        status = error.response.status_code if error.response is not None else 0
        raise _filed(status)(f"cannot {action} {url}: {_refusal(status, _server_message(error))}") from None
    except httpx.TransportError as error:  # no answer at all: nothing listens there, DNS, TLS, a timeout
        raise StorageUnavailable(
            f"cannot {action} {url}: the storage endpoint does not answer ({type(error).__name__}: "
            f"{_one_line(str(error))}); check `robotloop --endpoint URL ...`, ROBOTLOOP_STORAGE__ENDPOINT or "
            "HF_ENDPOINT"
        ) from None
    except (RuntimeError, ConnectionError) as error:  # how hf_xet reports failed transfers
        status = next((code for code in _HINTS if f"({code} " in str(error)), 0)
        hint = _HINTS.get(status, "the Xet transfer failed")
        raise _filed(status)(f"cannot {action} {url}: {hint}; hf_xet said: {_one_line(str(error))}") from None


# What to do about a refusal, by status, before the server's own message; other refusals are that message alone.
_HINTS = {
    401: "the bucket server refused the token (401): pass a valid one with `robotloop --token T`, "
    "ROBOTLOOP_STORAGE__TOKEN or HF_TOKEN",
    403: "the token may not do this (403): it needs write access to this namespace, or read access to the bucket",
    404: "not found (404): check the bucket and path",
    413: "the request is too large for the server (413)",
}

# The storage error of each category a refusal is filed under (a category not here: the nearest above it).
_STORAGE_ERRORS: dict[type[RobotloopError], type[StorageError]] = {
    errors.BadInput: StorageBadInput,
    errors.NotFound: NotFound,
    errors.Conflict: StorageConflict,
    errors.Refused: StorageRefused,
    errors.Unavailable: StorageUnavailable,
}


def _filed(status: int) -> type[StorageError]:
    """The storage error for an answer with HTTP `status`; a plain StorageError for a 500 (the server failed, filed
    under no category) or none (0: hf_xet's text named no status)."""
    kinds = category_of_status(status).__mro__ if status else ()
    return next((_STORAGE_ERRORS[kind] for kind in kinds if kind in _STORAGE_ERRORS), StorageError)


def _refusal(status: int, said: str) -> str:
    """What a refusal with HTTP `status` and the server's message `said` means, on one line."""
    if status in _HINTS:
        return f"{_HINTS[status]}; the server said: {said}" if said else _HINTS[status]
    return f"{said} ({status})" if said else f"the bucket server answered {status}"


def _server_message(error: HfHubHTTPError | httpx.HTTPStatusError) -> str:
    """The server's own message, on one line: a refused batch's failures, the `X-Error-Message` or the body's
    `error`, else the status's reason phrase (never the URL and the MDN link httpx's text adds)."""
    failures = getattr(error, "failures", None)  # huggingface_hub's BucketBatchError
    if failures:
        return _one_line("; ".join(f"{f.get('path')}: {f.get('error')}" for f in failures[:10]))
    said = getattr(error, "server_message", None)
    if said:
        return _one_line("; ".join(said.splitlines()))
    return error.response.reason_phrase if error.response is not None else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())
