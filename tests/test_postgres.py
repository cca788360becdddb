"""PostgreSQL for the services (issue 31): two deploy services and two bucket servers (over one shared root) on one
real PostgreSQL (`postgres`, tests/pgserver.py), each a real process on 127.0.0.1.

What one replica commits, the other serves: releases, channels, assignments (a long-poll on one answers a promotion
made through the other), one history; uploads and listings. A batch is whole or absent, even when the replica
applying it is killed. PostgreSQL restarted under load: 503 while it is down, then the services carry on and no
acknowledged commit is lost. A wrong ``--database``: one line at start.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from robotloop.database import lock_key
from robotloop.deploy.client import DeployClient, DeployError
from robotloop.deploy.keys import generate_keypair, load_private_key
from robotloop.deploy.local import LocalDeployService, start_local_deploy_service
from robotloop.deploy.manifest import SignedManifest, build_manifest
from robotloop.service_process import free_port
from robotloop.storage import BucketClient, BucketUrl, Entry

from .conftest import WRITE_TOKEN, Server, start_server
from .pgserver import PgServer

OPS = "rl_pg_ops"
BUCKET = BucketUrl.parse("hf://buckets/lab/pg")
AUTH = {"authorization": f"Bearer {WRITE_TOKEN}"}


@pytest.fixture(scope="module")
def deploys(postgres: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalDeployService]]:
    """Two deploy services on one PostgreSQL database, with the same operator token."""
    url = postgres.database("robotloop")  # one database for both services: each store has its own schema
    base = tmp_path_factory.mktemp("deploy-pg")
    services = [start_local_deploy_service(base / f"r{i}", OPS, extra_args=("--database", url)) for i in range(2)]
    yield services
    for service in services:
        service.proc.terminate()
        service.proc.wait(10)


@pytest.fixture(scope="module")
def buckets(postgres: PgServer, tmp_path_factory: pytest.TempPathFactory, tokens_file: Path) -> Iterator[list[Server]]:
    """Two bucket servers over one storage root and one PostgreSQL database; the bucket `BUCKET` made."""
    url = postgres.database("robotloop")
    root = tmp_path_factory.mktemp("bucket-pg") / "root"
    servers = [start_server(root, tokens_file, extra_args=("--database", url)) for _ in range(2)]
    BucketClient(servers[0].endpoint, WRITE_TOKEN).create_bucket(BUCKET)
    yield servers  # a test that kills one puts its successor in its place
    for server in servers:
        server.proc.terminate()
        server.proc.wait(10)


@pytest.fixture(scope="module")
def seed(buckets: list[Server], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Xet hash of a file uploaded once (through the first server), for batches to add under other paths."""
    src = tmp_path_factory.mktemp("seed")
    (src / "seed.bin").write_bytes(b"seed" * 100)
    client = BucketClient(buckets[0].endpoint, WRITE_TOKEN)
    client.upload(src, BUCKET / "seed")
    return client.ls(BUCKET / "seed")[0].xet_hash


def _signed(tmp_path: Path, name: str) -> SignedManifest:
    key = tmp_path / "k.key"
    if not key.exists():
        generate_keypair(key)
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
    manifest = build_manifest(tmp_path / "m", name, "lab/x", "hf://buckets/lab/x/c", {"config.json": "0" * 64})
    return SignedManifest.sign(manifest, load_private_key(key))


def _batch(server: Server, lines: list[dict], timeout_s: float = 60) -> httpx.Response:
    body = "".join(json.dumps(line) + "\n" for line in lines)
    return httpx.post(
        f"{server.endpoint}/api/buckets/{BUCKET.namespace}/{BUCKET.bucket}/batch",
        content=body,
        headers=AUTH,
        timeout=timeout_s,
    )


def _paths(server: Server, under: str) -> list[str]:
    entries = BucketClient(server.endpoint, WRITE_TOKEN).ls(BUCKET / under, recursive=True)
    return sorted(e.url.path for e in entries if isinstance(e, Entry))


def test_deploy_replicas_serve_one_fleet_one_set_of_channels_and_one_history(deploys, tmp_path):
    a, b = (DeployClient(s.url, OPS) for s in deploys)
    a.publish(_signed(tmp_path, "pg-v1"), channel="stable")
    a.publish(_signed(tmp_path, "pg-v2"))
    assert b.status()["channels"]["stable"] == "pg-v1"
    token = b.register_robot("pg-r1", channel="stable")
    with pytest.raises(DeployError) as taken:  # one fleet: the name is taken on the other replica too
        a.register_robot("pg-r1")
    assert taken.value.status == 409
    robot_a, robot_b = (DeployClient(s.url, token) for s in deploys)
    assert robot_a.assignment("pg-r1")["release"] == "pg-v1"

    # A robot long-polling replica b hears of a promotion made through replica a.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(robot_b.assignment, "pg-r1", "pg-v1", 20)
        time.sleep(0.5)
        promoted = time.monotonic()
        a.promote("stable", "pg-v2", reason="through a")
        assert waiting.result(30)["release"] == "pg-v2"
        assert time.monotonic() - promoted < 3  # the other replica looks every 0.2 s, not at its 20 s timeout

    # Reports through both replicas land in one history, in the order they were made.
    for i in range(6):
        robot = (robot_a, robot_b)[i % 2]
        robot.event("pg-r1", "swap", ("pg-v1", "pg-v2")[i % 2], None, detail=f"step {i}")
        robot.heartbeat("pg-r1", ("pg-v1", "pg-v2")[i % 2], {"control_hz": 50.0 + i})
    swaps = [e["detail"] for e in a.history(robot="pg-r1") if e["kind"] == "swap"]
    assert swaps == [f"step {i}" for i in reversed(range(6))]
    assert a.robot("pg-r1")["status"] == b.robot("pg-r1")["status"] == {"control_hz": 55.0}

    # Promotions racing through both replicas: each history row names the release its own promote replaced.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: (a, b)[i % 2].promote("stable", ("pg-v1", "pg-v2")[i % 3 % 2]), range(12)))
    chain = [e for e in reversed(b.history(channel="stable")) if e["kind"] == "promote"]
    assert len(chain) == 14  # the publish onto stable, the promote through a, the 12 racing
    assert all(later["previous"] == earlier["release"] for earlier, later in zip(chain, chain[1:], strict=False))
    before = a.status()["channels"]["stable"]
    rolled = b.rollback_channel("stable", reason="through b")
    assert rolled["previous"] == before
    assert a.status()["channels"]["stable"] == b.status()["channels"]["stable"] == rolled["release"]


def test_bucket_servers_over_one_root_list_each_others_uploads_and_refuse_a_batch_whole(buckets, tmp_path):
    a, b = (BucketClient(s.endpoint, WRITE_TOKEN) for s in buckets)
    src = tmp_path / "up"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    a.upload(src, BUCKET / "ep")
    listed_a, listed_b = a.ls(BUCKET / "ep", recursive=True), b.ls(BUCKET / "ep", recursive=True)
    assert sorted(e.url.path for e in listed_b) == ["ep/f0.bin", "ep/f1.bin", "ep/f2.bin"]
    assert listed_a == listed_b
    assert b.download(listed_b[2], tmp_path / "f2.bin").read_bytes() == bytes([2]) * 1002
    # The CAS index is in PostgreSQL too, one for both: what a reads, b counts, and neither keeps a SQLite index.
    assert not list(buckets[0].root.rglob("*.sqlite"))
    stats = [s.stats() for s in buckets]
    assert stats[0]["files"] == stats[1]["files"] >= 3 and stats[0]["stored_bytes"] == stats[1]["stored_bytes"]

    # Listings in code-point order, folders found by range scans, whatever the database's own collation (the
    # session's is ICU en-US, where "a-b" < "a.b" < "a/b" < "a0" < "B" would not hold as they do here).
    odd = ["B", "_z", "a-b", "a.b", "a/b", "a/c/d", "a0", "ab", "\u00e9"]
    lines = [{"type": "addFile", "path": f"order/{p}", "xetHash": listed_a[0].xet_hash} for p in odd]
    assert _batch(buckets[1], lines).status_code == 200
    assert _paths(buckets[0], "order") == [f"order/{p}" for p in sorted(odd)]
    children = [e.url.path if isinstance(e, Entry) else e.path for e in a.ls(BUCKET / "order")]
    # The folder "a" comes where its first file "a/b" is: after "a.b" ('/' follows '.'), before "a0".
    assert children == [f"order/{p}" for p in ["B", "_z", "a-b", "a.b", "a", "a0", "ab", "\u00e9"]]

    # 2,000 adds and one that would put a file under a file: through b, refused whole; a lists none of them.
    xet = listed_a[0].xet_hash
    adds = [{"type": "addFile", "path": f"many/{i:05d}", "xetHash": xet} for i in range(2000)]
    refused = _batch(buckets[1], [*adds, {"type": "addFile", "path": "ep/f0.bin/x", "xetHash": xet}])
    assert refused.status_code == 409, refused.text
    assert _paths(buckets[0], "many") == []
    assert _batch(buckets[1], adds).status_code == 200
    assert len(_paths(buckets[0], "many")) == 2000


def test_a_bucket_server_killed_mid_batch_leaves_the_batch_absent_and_the_store_writable(
    buckets, seed, postgres, tokens_file
):
    import psycopg

    n = 3000
    lines = [{"type": "addFile", "path": f"killed/{i:05d}", "xetHash": seed} for i in range(n)]
    b = buckets[1]
    sender = threading.Thread(target=_send_to_be_killed, args=(b, lines))
    sender.start()
    # Killed once its transaction holds the store's writer lock: inside the batch, some rows written, none committed.
    writer_lock = lock_key("buckets") & (2**64 - 1)  # as pg_locks shows it: classid high 32 bits, objid low
    with psycopg.connect(postgres.url("robotloop"), autocommit=True) as watch:
        deadline = time.monotonic() + 30
        while writer_lock not in {
            c << 32 | o
            for c, o in watch.execute("SELECT classid, objid FROM pg_locks WHERE locktype = 'advisory' AND granted")
        }:
            assert time.monotonic() < deadline, "the batch never began its transaction"
            time.sleep(0.005)
        b.proc.kill()
        b.proc.wait(10)
    sender.join(60)
    assert _paths(buckets[0], "killed") == []
    # PostgreSQL rolled it back when the connection dropped, and let go of the lock: the other server writes at once.
    started = time.monotonic()
    assert _batch(buckets[0], lines[:10]).status_code == 200
    assert time.monotonic() - started < 5
    assert len(_paths(buckets[0], "killed")) == 10
    buckets[1] = start_server(b.root, tokens_file, extra_args=_database_args(b))  # for the tests after this one


def _database_args(server: Server) -> tuple[str, ...]:
    args = server.proc.args
    return ("--database", args[args.index("--database") + 1])


def _send_to_be_killed(server: Server, lines: list[dict]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server is killed under it: what the test is about
        _batch(server, lines)


def test_postgres_restarted_under_load_gives_503_then_carries_on_without_losing_a_commit(
    postgres, deploys, buckets, seed
):
    ops = DeployClient(deploys[0].url, OPS)
    token = ops.register_robot("pg-load")
    robots = [DeployClient(s.url, token) for s in deploys]
    acked_paths: list[str] = []
    acked_events: list[str] = []
    statuses: dict[str, set[int]] = {"bucket": set(), "deploy": set()}
    stop = threading.Event()

    def upload_paths() -> None:  # one small batch after another, through both bucket servers
        for i in range(100_000):
            if stop.is_set():
                return
            path = f"load/{i:06d}"
            try:
                status = _batch(buckets[i % 2], [{"type": "addFile", "path": path, "xetHash": seed}], 20).status_code
            except httpx.HTTPError:
                status = 0
            statuses["bucket"].add(status)
            if status == 200:
                acked_paths.append(path)
            else:
                time.sleep(0.05)

    def report_events() -> None:  # robot events (appended to the history), through both deploy services
        for i in range(100_000):
            if stop.is_set():
                return
            try:
                robots[i % 2].event("pg-load", "refused", None, None, detail=f"load {i}")
                acked_events.append(f"load {i}")
                statuses["deploy"].add(200)
                time.sleep(0.01)  # paced so that every acked event fits in one page of history (1000), however fast
            except DeployError as error:
                statuses["deploy"].add(error.status)
                time.sleep(0.05)

    writers = [threading.Thread(target=upload_paths), threading.Thread(target=report_events)]
    for writer in writers:
        writer.start()
    try:
        time.sleep(1.5)
        postgres.stop("fast")  # rolls back what is open and drops every connection, as a restart does
        try:
            time.sleep(0.5)
            down_bucket = httpx.get(f"{buckets[1].endpoint}/api/buckets/lab/pg/tree", headers=AUTH, timeout=20)
            down_deploy = httpx.get(f"{deploys[1].url}/v1/robots", headers={"authorization": f"Bearer {OPS}"})
            assert down_bucket.status_code == 503, down_bucket.text
            assert down_deploy.status_code == 503, down_deploy.text
            assert "error" in down_deploy.json()
            acked_while_down = len(acked_paths), len(acked_events)
            time.sleep(1.0)
        finally:
            postgres.start()
        time.sleep(2.0)  # the services carry on, with no restart of theirs
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    assert len(acked_paths) > acked_while_down[0] + 5 and len(acked_events) > acked_while_down[1] + 5
    assert statuses["bucket"] <= {200, 503} and statuses["deploy"] <= {200, 503}, statuses
    assert 503 in statuses["bucket"] and 503 in statuses["deploy"]
    assert set(acked_paths) <= set(_paths(buckets[1], "load"))
    assert len(acked_events) < 1000  # what one page of history holds
    history = {e["detail"] for e in ops.history(robot="pg-load", limit=1000)}
    assert set(acked_events) <= history


def test_a_wrong_database_url_or_password_is_one_line_at_start(postgres, tmp_path, tokens_file):
    tokens = tmp_path / "ops.tokens"
    tokens.write_text(f"{OPS} write *\n")
    wrong_password = postgres.url("robotloop", password="not-the-password")
    nobody_there = f"postgresql://robotloop@127.0.0.1:{free_port()}/buckets"
    starts = {
        "password": ["services.deploy", "--tokens", str(tokens), "--allow-any-signer", "--database", wrong_password],
        "scheme": ["services.deploy", "--tokens", str(tokens), "--allow-any-signer", "--database", "mysql://db/x"],
        "refused": ["services.bucket", "--root", str(tmp_path / "root"), "--database", nobody_there],
    }
    procs = {
        why: subprocess.Popen(
            [sys.executable, "-m", *args, "--port", str(free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for why, args in starts.items()
    }
    said = {why: proc.communicate(timeout=60) for why, proc in procs.items()}
    for why, proc in procs.items():
        assert proc.returncode == 1, (why, said[why])
        err = said[why][1].strip()
        assert "\n" not in err and "Traceback" not in err and err.startswith("error: "), (why, err)
    assert "password authentication failed" in said["password"][1]
    assert "not-the-password" not in said["password"][1]  # the URL is shown with its password redacted
    assert "not a PostgreSQL URL" in said["scheme"][1]
    assert "cannot connect" in said["refused"][1]


def test_scrub_reads_the_index_the_servers_keep_in_postgres(buckets, seed, postgres):
    from typer.testing import CliRunner

    from robotloop.cli import app

    argv = ["bucket", "scrub", "--root", str(buckets[0].root), "--database", postgres.url("robotloop")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "nothing damaged" in result.output and "checked 0 xorbs" not in result.output


def test_a_replica_wakes_its_long_polls_once_for_its_own_change_and_once_for_anothers(postgres):
    """`RegistryDb.version` (what long-polls watch) moves once per assignment change: a replica's own write is not
    counted again when its follower thread reads the shared version row, another replica's is counted once."""
    from robotloop.deploy.registry.db import VERSION_POLL_S, RegistryDb

    url = postgres.database("registry_version_wakes")
    ours, theirs = RegistryDb(url), RegistryDb(url)
    try:
        time.sleep(3 * VERSION_POLL_S)  # both followers have read the row once
        ours.tx([("UPDATE channels SET release = NULL WHERE name = ?", ("stable",))])  # wakes polls
        time.sleep(5 * VERSION_POLL_S)
        assert ours.version == 1  # before: 2, once written and once read back by the follower
        assert theirs.version == 1  # the other replica's follower saw it
        theirs.tx([("UPDATE channels SET release = NULL WHERE name = ?", ("stable",))])
        time.sleep(5 * VERSION_POLL_S)
        assert (ours.version, theirs.version) == (2, 2)
    finally:
        ours.close()
        theirs.close()
