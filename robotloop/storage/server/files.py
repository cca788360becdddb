"""Whole-file views over the CAS: byte ranges of a stored file (for `/resolve` GETs), server figures, the scrub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import xet_format as xf
from .buckets import BucketStore
from .cas import CasStore


def read_file_range(cas: CasStore, file_hash: str, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``[start, end)`` of a stored file, rebuilt from its xorbs (for ``/resolve`` GETs).

    Uses the same reconstruction plan the CAS gives hf_xet: for each term, read the xorb byte
    range listed in ``fetch_info``, decompress the chunks, keep the term's chunks; the first
    term is trimmed by ``offset_into_first_range`` and the total is cut at ``end - start``.

    Raises:
        robotloop.storage.server.cas.CasError: unknown file or unsatisfiable range.
    """
    plan = cas.reconstruction(file_hash, (start, end))
    skip, left = plan["offset_into_first_range"], end - start
    for term in plan["terms"]:
        if left <= 0:
            return
        data = _term_bytes(cas, term, plan["fetch_info"][term["hash"]])[skip:]
        skip = 0
        yield data[:left]
        left -= min(len(data), left)


def _term_bytes(cas: CasStore, term: dict, fetches: list[dict]) -> bytes:
    t0, t1 = term["range"]["start"], term["range"]["end"]
    fetch = next(f for f in fetches if f["range"]["start"] <= t0 and t1 <= f["range"]["end"])
    url_range = fetch["url_range"]
    blob = b"".join(_read_xorb(cas, term["hash"], url_range["start"], url_range["end"]))
    out, pos = [], 0
    for index in range(fetch["range"]["start"], t1):  # chunks of the fetched span, in order
        _version, packed3, scheme, raw3 = xf.CHUNK_HEADER.unpack_from(blob, pos)
        packed, raw = int.from_bytes(packed3, "little"), int.from_bytes(raw3, "little")
        body_start = pos + xf.CHUNK_HEADER.size
        pos = body_start + packed
        if index >= t0:
            out.append(xf.decompress_chunk(scheme, blob[body_start:pos], raw))
    return b"".join(out)


def _read_xorb(cas: CasStore, xorb_hash: str, first: int, last: int) -> Iterator[bytes]:
    yield cas.read_verified(xorb_hash, first, last).data  # inclusive range, counted as served; DamagedXorb if bad


def scrub_root(root: Path, database: str | None = None) -> dict[str, Any]:
    """Check a bucket server's whole data root (every xorb and shard against its hash, `CasStore.scrub`) and name the
    bucket files each damaged xorb breaks. Safe beside a running server (SQLite WAL, or the server's PostgreSQL
    `database`); damaged xorbs are marked, so the server stops offering them for dedup and the next upload of their
    bytes repairs them.

    Raises:
        BadDatabaseUrl, DatabaseUnavailable: `database` is not a PostgreSQL URL, or cannot be reached.
    """
    cas = CasStore(Path(root) / "cas", database=database)
    buckets = BucketStore(root, file_size=cas.file_size, database=database)
    report = cas.scrub()
    for item in report["damaged"]:
        item["paths"] = sorted({p for f in item["files"] for p in buckets.paths_of(f)})
    return report


def server_stats(cas: CasStore, buckets: BucketStore) -> dict[str, Any]:
    """CAS counters (bytes received/served, xorbs, chunks, stored bytes) + bucket logical bytes.

    ``dedup_ratio`` = logical bytes referenced by bucket paths / bytes actually stored.
    """
    out: dict[str, Any] = dict(cas.stats())
    out.update(buckets.logical_bytes())
    stored = out.get("stored_bytes")
    if isinstance(stored, int) and stored > 0:
        out["dedup_ratio"] = round(out["logical_bytes"] / stored, 4)
    return out
