"""Ranged reads of bucket files by Xet hash, through hf_xet's download streams.

A release manifest names each file by its Xet hash, so the robot fetches exactly the content that was
signed, whatever the bucket path holds now. Only the requested byte range travels (hf_xet asks the CAS for
the chunks that cover it).

Why not hf_xet's chunk cache: hf_xet 1.8 reads HF_XET_CHUNK_CACHE_SIZE_BYTES but its download sessions are
built without a cache (xet-core `FileDownloadSession::new(config, None)` in xet_pkg/src/xet_session), and a
measured re-download of a file sharing 75% of its chunks with one already fetched moved 100% of its bytes
again. So the robot's store keeps verified segments itself and fetches only the ranges it lacks.

Example:
    ```python
    >>> fetcher = XetFetcher("http://127.0.0.1:8750", token, "lab/demos")
    >>> data = b"".join(fetcher.stream(xet_hash, size, start=0, end=1024))
    ```
"""

from __future__ import annotations

from collections.abc import Iterator

from ..storage import StorageError


class XetFetcher:
    """Reads byte ranges of files of one bucket, by Xet hash. Thread-safe for sequential use per thread."""

    def __init__(self, endpoint: str, token: str | None, bucket_id: str) -> None:
        self.endpoint, self.token, self.bucket_id = endpoint.rstrip("/"), token, bucket_id
        self._group = None

    def _stream_group(self):
        from huggingface_hub.utils import build_hf_headers

        from ..compat import xet_refresh_url, xet_session

        if self._group is None:
            refresh = xet_refresh_url(self.bucket_id, self.endpoint, write=False)
            headers = build_hf_headers(token=self.token, library_name="robotloop")
            self._group = xet_session().new_download_stream_group(
                token_refresh_url=refresh, token_refresh_headers=headers
            )
        return self._group

    def stream(self, xet_hash: str, size: int, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of the file with this Xet hash and size, in order.

        Raises:
            StorageError: the transfer failed (no such file in the bucket, a token that cannot read it, ...), or
                ended with another number of bytes than the range holds.
        """
        import hf_xet

        sent = 0
        try:
            for block in self._stream_group().download_stream(hf_xet.XetFileInfo(xet_hash, size), start=start, end=end):
                sent += len(block)
                yield block
        except (RuntimeError, ConnectionError, OSError) as error:  # how hf_xet reports failed transfers
            self._group = None  # a broken group (expired token, server restart) is rebuilt on the next call
            raise StorageError(self._cannot_read(xet_hash, start, end, str(error))) from None
        if sent != end - start:
            # A transfer, not the bytes: a stream that ended early (seen once under load, 2026-12-06, where the file
            # was not readable at all) is retried and resumed like any failed transfer. Reported as an integrity
            # failure it would count towards refusing the release for good.
            self._group = None
            raise StorageError(self._cannot_read(xet_hash, start, end, f"the stream ended after {sent} bytes"))

    def _cannot_read(self, xet_hash: str, start: int, end: int, why: str) -> str:
        return (
            f"cannot read bytes {start}-{end} of {xet_hash[:12]} from bucket {self.bucket_id} at {self.endpoint}: {why}"
        )
