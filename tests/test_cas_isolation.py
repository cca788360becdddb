"""A write token of one namespace cannot reach another namespace's data through the CAS: not through global dedup
answers, not through shards that describe files over someone else's xorbs, not through what a refusal says.

The attack (found by a probe on 2026-12-01): knowing one chunk of a victim's private file, ask global dedup about it,
get the victim's xorb and its chunk lengths, upload a shard describing a file over that xorb (the refusal of a wrong
file hash stated the right one), add the file to one's own bucket, download the victim's bytes. Real bucket server,
real hf_xet client, and raw HTTP for what the client would never send.
"""

from __future__ import annotations

import os
import sqlite3

import httpx
from huggingface_hub import HfApi

from robotloop.storage.server import xet_format as xf

from .conftest import OTHER_NS_TOKEN, WRITE_TOKEN


def _victims_file(server, tmp_path) -> tuple[bytes, str, list[tuple[str, bytes, int]]]:
    """A private file of namespace 'victim' (several chunks); its Xet hash and, per term, (xorb, chunk hashes, raw
    length), read from the server's index: what the attacker would have to guess or be told."""
    api = HfApi(endpoint=server.endpoint, token=WRITE_TOKEN)
    api.create_bucket("victim/private")
    secret = b"# robot config, known to many\n" * 2000 + os.urandom(400_000)
    api.batch_bucket_files("victim/private", add=[(secret, "config.txt")])
    file_hex = next(iter(api.get_bucket_paths_info("victim/private", ["config.txt"]))).xet_hash
    db = sqlite3.connect(server.root / "cas" / "index.sqlite")
    terms = []
    for xorb, start, end, raw in db.execute(
        "SELECT xorb, chunk_start, chunk_end, raw_len FROM file_terms WHERE file = ? ORDER BY idx", (file_hex,)
    ):
        rows = db.execute(
            "SELECT hash FROM xorb_chunks WHERE xorb = ? AND idx >= ? AND idx < ? ORDER BY idx", (xorb, start, end)
        )
        terms.append((xorb, [r[0] for r in rows], raw))
    db.close()
    return secret, file_hex, terms


def _cas(server, token: str, bucket: str, kind: str) -> tuple[str, dict]:
    r = httpx.get(
        f"{server.endpoint}/api/buckets/{bucket}/xet-{kind}-token", headers={"authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    return r.json()["casUrl"], {"authorization": f"Bearer {r.json()['accessToken']}"}


def test_another_namespace_cannot_learn_reference_or_read_a_private_file(bucket_server, tmp_path):
    secret, file_hex, terms = _victims_file(bucket_server, tmp_path)
    thief = HfApi(endpoint=bucket_server.endpoint, token=OTHER_NS_TOKEN)
    thief.create_bucket("other/thief")
    cas, auth = _cas(bucket_server, OTHER_NS_TOKEN, "other/thief", "write")
    first_chunk = xf.hash_to_hex(terms[0][1][0])

    # 1. Global dedup does not answer about another namespace's chunk: the same 404 as for an unknown one.
    r = httpx.get(f"{cas}/v1/chunks/default-merkledb/{first_chunk}", headers=auth)
    assert r.status_code == 404, "dedup named the victim's xorb to another namespace"
    _, read_auth = _cas(bucket_server, OTHER_NS_TOKEN, "other/thief", "read")
    assert httpx.get(f"{cas}/v1/chunks/default-merkledb/{first_chunk}", headers=read_auth).status_code == 403
    # The victim's own uploads are still deduplicated against (its write token gets the answer).
    own_cas, own_auth = _cas(bucket_server, WRITE_TOKEN, "victim/private", "write")
    assert httpx.get(f"{own_cas}/v1/chunks/default-merkledb/{first_chunk}", headers=own_auth).status_code == 200

    # 2. A shard describing a file over the victim's xorbs (their hashes and chunk lengths leaked somehow) is refused,
    #    and no refusal states the file hash the terms give.
    file_terms = [xf.FileTerm(xf.hex_to_hash(x), 0, len(hashes), raw) for x, hashes, raw in terms]

    def upload(fhash: bytes, verification: list[bytes] | None) -> httpx.Response:
        shard = xf.serialize_shard(xf.Shard([xf.ShardFile(fhash, file_terms, verification=verification)], []))
        return httpx.post(f"{cas}/v1/shards", content=shard, headers=auth)

    guess = upload(os.urandom(32), None)
    assert guess.status_code == 400 and file_hex not in guess.text, guess.text
    right = upload(xf.hex_to_hash(file_hex), None)  # even the right hash: no proof of holding the chunks
    assert right.status_code == 400 and "verification" in right.text, right.text
    forged = upload(xf.hex_to_hash(file_hex), [os.urandom(32) for _ in file_terms])
    assert forged.status_code == 400 and "verification hash mismatch" in forged.text, forged.text
    # Nor may a xorb be claimed by re-uploading it under its hash with other bytes.
    r = httpx.post(
        f"{cas}/v1/xorbs/default/{terms[0][0]}", content=xf.serialize_chunk(b"not the victim's"), headers=auth
    )
    assert r.status_code == 400

    # 3. So the file cannot be added to the thief's bucket, and the victim's bytes stay unread.
    link = f'{{"type": "addFile", "path": "stolen.txt", "xetHash": "{file_hex}", "mtime": 0}}\n'
    r = httpx.post(
        f"{bucket_server.endpoint}/api/buckets/other/thief/batch",
        content=link,
        headers={"authorization": f"Bearer {OTHER_NS_TOKEN}"},
    )
    assert r.status_code == 422, r.text
    assert httpx.get(f"{cas}/v1/reconstructions/{file_hex}", headers=read_auth).status_code == 404

    # 4. The unmodified client in the thief's namespace uploads the part it knows: its own bytes, its own xorbs,
    #    and reading it back gives just that part.
    known = secret[:60_000]
    thief.batch_bucket_files("other/thief", add=[(known, "known.txt")])
    got = thief.download_bucket_files("other/thief", [("known.txt", str(tmp_path / "known.txt"))])
    assert (tmp_path / "known.txt").read_bytes() == known, got
    assert [e.path for e in thief.list_bucket_tree("other/thief")] == ["known.txt"]
