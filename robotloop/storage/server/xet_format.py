"""Xet wire formats: hashes, xorbs and shards, as pure functions.

Written from the Xet protocol spec (huggingface.co/docs/xet) and checked byte-for-byte against
what the hf_xet 1.8 client sends. Everything here is little-endian and hand-packed with
`struct`, because the formats are fixed-size C-like records with no self-describing framing.

Hashes are handled as raw 32-byte `bytes` internally. Xet prints a hash as hex in an unusual
order: the 32 bytes are read as four little-endian u64 words and each word is printed as 16 hex
digits. `hash_to_hex` / `hex_to_hash` do that conversion; URL paths and JSON always use it.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import blake3
import lz4.frame

from ...errors import BadInput

# ---------------------------------------------------------------------------------------------
# Hashing

# Keys fixed by the Xet spec (random.org constants in the reference implementation).
DATA_KEY = bytes(
    [
        102,
        151,
        245,
        119,
        91,
        149,
        80,
        222,
        49,
        53,
        203,
        172,
        165,
        151,
        24,
        28,
        157,
        228,
        33,
        16,
        155,
        235,
        43,
        88,
        180,
        208,
        176,
        75,
        147,
        173,
        242,
        41,
    ]
)
INTERNAL_NODE_KEY = bytes(
    [
        1,
        126,
        197,
        199,
        165,
        71,
        41,
        150,
        253,
        148,
        102,
        102,
        180,
        138,
        2,
        230,
        93,
        221,
        83,
        111,
        55,
        199,
        109,
        210,
        248,
        99,
        82,
        230,
        74,
        83,
        113,
        63,
    ]
)
VERIFICATION_KEY = bytes(
    [
        127,
        24,
        87,
        214,
        206,
        86,
        237,
        102,
        18,
        127,
        249,
        19,
        231,
        165,
        195,
        243,
        164,
        205,
        38,
        213,
        181,
        219,
        73,
        230,
        65,
        36,
        152,
        127,
        40,
        251,
        148,
        195,
    ]
)
ZERO_HASH = bytes(32)
BOOKEND_HASH = b"\xff" * 32  # marks the end of a shard section
GLOBAL_DEDUP_MODULUS = 1024  # a chunk is globally dedup-eligible when hash % 1024 == 0
MERKLE_BRANCHING = 4  # mean branching factor of the xorb/file merkle tree


class FormatError(BadInput, ValueError):
    """Bytes that do not follow the Xet xorb or shard format."""


class TruncatedError(FormatError):
    """The bytes end before the structure they describe does."""


def hash_to_hex(h: bytes) -> str:
    """Raw 32-byte hash -> Xet hex string (each 8-byte LE word printed big-endian)."""
    return "".join(h[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def hex_to_hash(s: str) -> bytes:
    """Xet hex string -> raw 32 bytes. Raises FormatError if not 64 lowercase hex digits."""
    if len(s) != 64 or s.strip("0123456789abcdef"):
        raise FormatError(f"not a 64-char lowercase hex hash: {s!r}")
    b = bytes.fromhex(s)
    return b"".join(b[i : i + 8][::-1] for i in range(0, 32, 8))


def chunk_hash(data: bytes) -> bytes:
    """Hash of one chunk's uncompressed bytes: blake3 keyed with DATA_KEY."""
    return blake3.blake3(data, key=DATA_KEY).digest()


def _u64(h: bytes, word: int) -> int:
    return int.from_bytes(h[8 * word : 8 * word + 8], "little")


def truncate_hash(h: bytes) -> int:
    """The u64 key that shard lookup tables sort on (first LE word)."""
    return _u64(h, 0)


def is_global_dedup_eligible(h: bytes) -> bool:
    """Spec rule: the chunk is queryable for global dedup if last LE word % 1024 == 0."""
    return _u64(h, 3) % GLOBAL_DEDUP_MODULUS == 0


def _merge(nodes: list[tuple[bytes, int]]) -> tuple[bytes, int]:
    # An internal node hashes the text "{hex} : {size}\n" of each child, so sizes are bound too.
    text = "".join(f"{hash_to_hex(h)} : {n}\n" for h, n in nodes)
    return blake3.blake3(text.encode(), key=INTERNAL_NODE_KEY).digest(), sum(n for _, n in nodes)


def _next_cut(nodes: list[tuple[bytes, int]]) -> int:
    # Content-defined grouping: a group ends after a child whose hash % 4 == 0 (never before
    # the 3rd child), and is at most 2*4+1 children long. Keeps the tree stable under edits.
    if len(nodes) <= 2:
        return len(nodes)
    end = min(2 * MERKLE_BRANCHING + 1, len(nodes))
    for i in range(2, end):
        if _u64(nodes[i][0], 3) % MERKLE_BRANCHING == 0:
            return i + 1
    return end


def merkle_root(chunks: list[tuple[bytes, int]]) -> bytes:
    """Root of the Xet aggregated merkle tree over (chunk_hash, chunk_size) leaves."""
    if not chunks:
        return ZERO_HASH
    level = list(chunks)
    while len(level) > 1:
        nxt, i = [], 0
        while i < len(level):
            cut = _next_cut(level[i:])
            nxt.append(_merge(level[i : i + cut]))
            i += cut
        level = nxt
    return level[0][0]


def xorb_hash(chunks: list[tuple[bytes, int]]) -> bytes:
    """Xorb hash = merkle root of its chunks."""
    return merkle_root(chunks)


def file_hash(chunks: list[tuple[bytes, int]], salt: bytes = ZERO_HASH) -> bytes:
    """File hash = blake3 keyed by `salt` (zeros on the Hub) of the merkle root of its chunks."""
    if not chunks:
        return ZERO_HASH
    return blake3.blake3(merkle_root(chunks), key=salt).digest()


def verification_hash(chunk_hashes: list[bytes]) -> bytes:
    """Term verification hash: blake3 keyed by VERIFICATION_KEY of the concatenated chunk hashes."""
    return blake3.blake3(b"".join(chunk_hashes), key=VERIFICATION_KEY).digest()


# ---------------------------------------------------------------------------------------------
# Xorbs: a sequence of [8-byte chunk header][compressed chunk], optionally followed by a footer
# that starts with the ident b"XETBLOB" (hf_xet 1.8 does not send one on upload).

CHUNK_HEADER = struct.Struct("<B3sB3s")  # version, compressed len (u24), scheme, raw len (u24)
XORB_FOOTER_IDENT = b"XETBLOB"
MAX_CHUNK_SIZE = 128 * 1024  # spec: chunks are at most 128 KiB uncompressed
SCHEME_NONE, SCHEME_LZ4, SCHEME_BG4_LZ4 = 0, 1, 2


@dataclass(frozen=True)
class XorbChunk:
    """One chunk of a parsed xorb; byte offsets are into the serialized xorb."""

    hash: bytes
    byte_start: int  # offset of the chunk header
    byte_end: int  # one past the compressed data
    raw_len: int  # uncompressed length


@dataclass(frozen=True)
class ParsedXorb:
    hash: bytes
    chunks: list[XorbChunk]
    chunks_end: int  # where the chunk area ends (start of the footer, or len(body))

    @property
    def raw_len(self) -> int:
        return sum(c.raw_len for c in self.chunks)


def bg4_regroup(data: bytes) -> bytes:
    """Undo byte-grouping-4: data holds all bytes i%4==0, then i%4==1, ... ; interleave back."""
    n, split, rem = len(data), len(data) // 4, len(data) % 4
    sizes = [split + (rem > 0), split + (rem > 1), split + (rem > 2), split]
    out, pos = bytearray(n), 0
    for g, size in enumerate(sizes):
        out[g::4] = data[pos : pos + size]
        pos += size
    return bytes(out)


def decompress_chunk(scheme: int, payload: bytes, raw_len: int) -> bytes:
    """Decompress one chunk body. Raises FormatError on unknown scheme or bad data/length."""
    try:
        if scheme == SCHEME_NONE:
            raw = payload
        elif scheme == SCHEME_LZ4:
            raw = lz4.frame.decompress(payload)
        elif scheme == SCHEME_BG4_LZ4:
            raw = bg4_regroup(lz4.frame.decompress(payload))
        else:
            raise FormatError(f"unknown compression scheme {scheme}")
    except RuntimeError as e:  # lz4 raises RuntimeError on corrupt frames
        raise FormatError(f"corrupt LZ4 data: {e}") from e
    if len(raw) != raw_len:
        raise FormatError(f"chunk decompressed to {len(raw)} bytes, header says {raw_len}")
    return raw


def iter_chunks(body: bytes | memoryview) -> Iterator[tuple[int, int, bytes]]:
    """Yield (byte_start, byte_end, uncompressed bytes) for each chunk of a xorb or of a byte
    range of one (as fetched for a reconstruction term). Stops at an optional xorb footer.

    Raises TruncatedError / FormatError on malformed input.
    """
    mv, pos, i = memoryview(body), 0, 0
    while pos < len(mv):
        if bytes(mv[pos : pos + len(XORB_FOOTER_IDENT)]) == XORB_FOOTER_IDENT:
            return  # optional footer; its contents are derivable, so we do not trust them
        if pos + CHUNK_HEADER.size > len(mv):
            raise TruncatedError(f"truncated chunk header at byte {pos}")
        version, clen3, scheme, rlen3 = CHUNK_HEADER.unpack_from(mv, pos)
        clen, rlen = int.from_bytes(clen3, "little"), int.from_bytes(rlen3, "little")
        if version != 0:
            raise FormatError(f"chunk {i}: unsupported chunk header version {version}")
        if rlen > MAX_CHUNK_SIZE or clen > 2 * MAX_CHUNK_SIZE:
            raise FormatError(f"chunk {i}: length over limit ({clen} packed, {rlen} raw)")
        start, data_start = pos, pos + CHUNK_HEADER.size
        pos = data_start + clen
        if pos > len(mv):
            raise TruncatedError(f"chunk {i}: truncated, needs {clen} bytes at {data_start}")
        yield start, pos, decompress_chunk(scheme, bytes(mv[data_start:pos]), rlen)
        i += 1


def parse_xorb(body: bytes | memoryview) -> ParsedXorb:
    """Parse and hash a serialized xorb: decompress every chunk, hash it, build the xorb hash.

    Raises TruncatedError / FormatError on malformed input or an empty xorb.
    """
    chunks = [XorbChunk(chunk_hash(raw), a, b, len(raw)) for a, b, raw in iter_chunks(body)]
    if not chunks:
        raise FormatError("xorb has no chunks")
    h = xorb_hash([(c.hash, c.raw_len) for c in chunks])
    return ParsedXorb(h, chunks, chunks[-1].byte_end)


def serialize_chunk(data: bytes, scheme: int = SCHEME_NONE) -> bytes:
    """One xorb chunk (header + payload). Used by tests to build xorbs by hand."""
    if scheme == SCHEME_NONE:
        payload = data
    elif scheme == SCHEME_LZ4:
        payload = lz4.frame.compress(data)
    else:
        raise FormatError(f"serialize_chunk supports schemes 0 and 1, not {scheme}")
    return CHUNK_HEADER.pack(0, len(payload).to_bytes(3, "little"), scheme, len(data).to_bytes(3, "little")) + payload


# ---------------------------------------------------------------------------------------------
# Shards: header, file-info section, xorb-info section, each section ended by a bookend entry
# whose hash is all 0xff. Uploaded shards stop there; stored/served shards add lookup tables and
# a 200-byte footer. Every section entry is a 48-byte record: a 32-byte hash + 16 bytes.

SHARD_TAG = b"HFRepoMetaData\x00" + bytes(
    [85, 105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169]
)
SHARD_HEADER = struct.Struct("<32sQQ")  # tag, version (2), footer size
SHARD_VERSION = 2
FOOTER_VERSION = 1
ENTRY = struct.Struct("<32sIIII")  # hash + four u32 (meaning depends on the record kind)
FILE_HEADER = struct.Struct("<32sIIQ")  # file hash, flags, num entries, unused
FILE_FLAG_VERIFICATION = 1 << 31
FILE_FLAG_METADATA_EXT = 1 << 30
CHUNK_FLAG_GLOBAL_DEDUP = 1 << 31
SHARD_FOOTER = struct.Struct("<9Q32sQQ6Q4Q")  # 200 bytes
NO_EXPIRY = 2**64 - 1


@dataclass(frozen=True)
class FileTerm:
    xorb: bytes
    chunk_start: int
    chunk_end: int  # exclusive
    raw_len: int


@dataclass
class ShardFile:
    hash: bytes
    terms: list[FileTerm]
    verification: list[bytes] | None = None  # one range hash per term, when present
    sha256: bytes | None = None  # from the metadata extension, raw 32 bytes

    @property
    def size(self) -> int:
        return sum(t.raw_len for t in self.terms)


@dataclass(frozen=True)
class ShardChunk:
    hash: bytes
    raw_start: int  # uncompressed offset of the chunk inside its xorb
    raw_len: int
    flags: int


@dataclass
class ShardXorb:
    hash: bytes
    chunks: list[ShardChunk]
    raw_len: int  # uncompressed bytes in the xorb
    packed_len: int  # serialized xorb size ("bytes on disk"); 0 if unknown


@dataclass
class Shard:
    files: list[ShardFile] = field(default_factory=list)
    xorbs: list[ShardXorb] = field(default_factory=list)


def _entries(mv: memoryview, pos: int, count: int, what: str) -> tuple[list[tuple], int]:
    end = pos + count * ENTRY.size
    if count < 0 or end > len(mv):
        raise TruncatedError(f"truncated shard: {what} needs {count} entries at byte {pos}")
    return [ENTRY.unpack_from(mv, pos + i * ENTRY.size) for i in range(count)], end


def parse_shard(body: bytes | memoryview) -> Shard:
    """Parse a shard (with or without lookup tables/footer) into files and xorbs.

    Only the two sections are read; lookup tables and footer, if present, are ignored since they
    are derived data. Raises FormatError on a bad tag/version or when a section is truncated.
    """
    mv = memoryview(body)
    if len(mv) < SHARD_HEADER.size:
        raise TruncatedError(f"truncated shard: {len(mv)} bytes, header needs {SHARD_HEADER.size}")
    tag, version, _footer_size = SHARD_HEADER.unpack_from(mv, 0)
    if tag != SHARD_TAG:
        raise FormatError("not a shard: wrong magic tag")
    if version != SHARD_VERSION:
        raise FormatError(f"unsupported shard version {version}")
    shard, pos = Shard(), SHARD_HEADER.size
    while True:  # file-info section
        if pos + FILE_HEADER.size > len(mv):
            raise TruncatedError(f"truncated shard: file section has no bookend (at byte {pos})")
        fhash, flags, n, _ = FILE_HEADER.unpack_from(mv, pos)
        pos += FILE_HEADER.size
        if fhash == BOOKEND_HASH:
            break
        raw, pos = _entries(mv, pos, n, f"file {hash_to_hex(fhash)} terms")
        f = ShardFile(fhash, [FileTerm(h, s, e, ln) for h, _fl, ln, s, e in raw])
        if flags & FILE_FLAG_VERIFICATION:
            ver, pos = _entries(mv, pos, n, f"file {hash_to_hex(fhash)} verification")
            f.verification = [v[0] for v in ver]
        if flags & FILE_FLAG_METADATA_EXT:
            ext, pos = _entries(mv, pos, 1, f"file {hash_to_hex(fhash)} metadata ext")
            f.sha256 = ext[0][0]
        shard.files.append(f)
    while True:  # xorb-info section
        if pos + ENTRY.size > len(mv):
            raise TruncatedError(f"truncated shard: xorb section has no bookend (at byte {pos})")
        xhash, _flags, n, raw_len, packed_len = ENTRY.unpack_from(mv, pos)
        pos += ENTRY.size
        if xhash == BOOKEND_HASH:
            break
        raw, pos = _entries(mv, pos, n, f"xorb {hash_to_hex(xhash)} chunks")
        chunks = [ShardChunk(h, start, ln, fl) for h, start, ln, fl, _ in raw]
        shard.xorbs.append(ShardXorb(xhash, chunks, raw_len, packed_len))
    return shard


def keyed_chunk_hash(chunk_hash: bytes, key: bytes) -> bytes:
    """A chunk hash as a keyed global-dedup shard lists it: blake3 keyed by `key` (the footer's chunk hash key)."""
    return blake3.blake3(chunk_hash, key=key).digest()


def serialize_shard(shard: Shard, expiry: int = NO_EXPIRY, chunk_key: bytes | None = None) -> bytes:
    """Full shard (sections + lookup tables + footer), as a client loads it from its cache.

    Used for the global-dedup query answer. With `chunk_key` (32 bytes) every chunk hash is written keyed
    (`keyed_chunk_hash`) and the key goes into the footer: a client can match only chunks it holds, and the
    answer does not reveal the other chunks' hashes (which would let a caller describe files it never had).
    """
    key = chunk_key or ZERO_HASH
    listed = (lambda h: keyed_chunk_hash(h, key)) if chunk_key else (lambda h: h)
    out = bytearray(SHARD_HEADER.pack(SHARD_TAG, SHARD_VERSION, SHARD_FOOTER.size))
    file_info_off, file_lookup, index = len(out), [], 0
    for f in sorted(shard.files, key=lambda f: f.hash):
        flags = (FILE_FLAG_VERIFICATION if f.verification else 0) | (FILE_FLAG_METADATA_EXT if f.sha256 else 0)
        file_lookup.append((truncate_hash(f.hash), index))
        out += FILE_HEADER.pack(f.hash, flags, len(f.terms), 0)
        for t in f.terms:
            out += ENTRY.pack(t.xorb, 0, t.raw_len, t.chunk_start, t.chunk_end)
        for v in f.verification or []:
            out += ENTRY.pack(v, 0, 0, 0, 0)
        if f.sha256:
            out += ENTRY.pack(f.sha256, 0, 0, 0, 0)
        index += 1 + len(f.terms) * (2 if f.verification else 1) + (1 if f.sha256 else 0)
    out += FILE_HEADER.pack(BOOKEND_HASH, 0, 0, 0)
    xorb_info_off, xorb_lookup, chunk_lookup, index = len(out), [], [], 0
    for x in sorted(shard.xorbs, key=lambda x: x.hash):
        xorb_lookup.append((truncate_hash(x.hash), index))
        out += ENTRY.pack(x.hash, 0, len(x.chunks), x.raw_len, x.packed_len)
        for i, c in enumerate(x.chunks):
            h = listed(c.hash)
            out += ENTRY.pack(h, c.raw_start, c.raw_len, c.flags, 0)
            chunk_lookup.append((truncate_hash(h), index, i))
        index += 1 + len(x.chunks)
    out += ENTRY.pack(BOOKEND_HASH, 0, 0, 0, 0)
    file_lookup_off = len(out)
    for k, v in sorted(file_lookup):
        out += struct.pack("<QI", k, v)
    xorb_lookup_off = len(out)
    for k, v in sorted(xorb_lookup):
        out += struct.pack("<QI", k, v)
    chunk_lookup_off = len(out)
    for k, xi, ci in sorted(chunk_lookup):
        out += struct.pack("<QII", k, xi, ci)
    footer_off = len(out)
    out += SHARD_FOOTER.pack(
        FOOTER_VERSION,
        file_info_off,
        xorb_info_off,
        file_lookup_off,
        len(file_lookup),
        xorb_lookup_off,
        len(xorb_lookup),
        chunk_lookup_off,
        len(chunk_lookup),
        key,
        int(time.time()),
        expiry,
        *([0] * 6),
        sum(x.packed_len for x in shard.xorbs),
        sum(f.size for f in shard.files),
        sum(x.raw_len for x in shard.xorbs),
        footer_off,
    )
    return bytes(out)
