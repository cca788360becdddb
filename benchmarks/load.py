"""Load held, bounded and on 127.0.0.1 only: a fleet on the deploy service, uploaders on the bucket server.

Run:  .venv/bin/python benchmarks/load.py [--robots 200] [--uploaders 16] [--seconds 60] [--out load.json]
      [--database postgresql://USER:PW@127.0.0.1/DB | --postgres] [--replicas 2] [--fleet-procs 8]

1. Fleet: `--robots` simulated robots (asyncio, spread over `--fleet-procs` processes) long-poll their assignment
   (5 s) and heartbeat every 2 s for `--seconds`, while an operator promotes a new release on their channel every
   5 s. Figures: p50/p99 latency of heartbeats and of promotions, errors, how long robots took to see each
   promotion, and lost events: robots not on the last promoted release once they settle after the window.
2. Uploads: `--uploaders` threads each upload files of 0.2-2 MB (random bytes) to their own folder through the real
   client (huggingface_hub + hf_xet) for `--seconds`; then every acknowledged file is read back and compared.
With `--database`, each service runs as `--replicas` processes on that PostgreSQL database (the bucket servers over
one shared root): robot i talks to deploy replica i mod N, uploader i to bucket server i mod N; every acknowledged
file is read back through another server than the one it was uploaded to, and the listings of all servers must be
equal. `--postgres` starts a throwaway PostgreSQL for the run as the suite does (tests/pgserver.py: initdb and
pg_ctl of the `initdb` on PATH, on a free port) and stops it after. Without either: one service each, on SQLite (the
embedded default), the figures to compare with.
Both stop by themselves; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import httpx

from robotloop.deploy.client import DeployClient
from robotloop.deploy.keys import generate_keypair, load_private_key
from robotloop.deploy.local import start_local_deploy_service
from robotloop.deploy.publish import publish
from robotloop.deploy.runner import make_tiny_checkpoint
from robotloop.errors import RobotloopError
from robotloop.service_process import free_port, start_service_process
from robotloop.storage import BucketClient, BucketUrl, Entry
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

OPS = "bench-load-ops"
SETTLE_S = 30.0  # how long robots may take after the window to settle on the last release (see `_fleet_run`)
RUN = "hf://buckets/bench/load/models/tiny"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robots", type=int, default=200)
    ap.add_argument("--uploaders", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--database", default=None, help="postgresql://...: run --replicas of each service on it")
    ap.add_argument("--postgres", action="store_true", help="start a throwaway PostgreSQL and run on it")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument(
        "--fleet-procs",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) // 2)),
        help="processes the simulated robots are spread over (default: half the cores, at most 8)",
    )
    args = ap.parse_args(argv)
    if args.postgres and args.database:
        ap.error("--postgres starts its own database: give it or --database, not both")
    with contextlib.ExitStack() as stack:
        if args.postgres:
            args.database = stack.enter_context(throwaway_postgres())
        if args.database is None:
            args.replicas = 1
        return run(args)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL cluster in a temporary folder (the suite's helper), its database's URL; removed after."""
    import shutil
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))  # the repository's root, where tests/ is
    from tests.pgserver import start_postgres

    server, base = start_postgres(icu=False)  # builds without ICU run too; collation does not matter for load
    try:
        yield server.database("robotloop")
    finally:
        server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = ensure_embedded_server(work / "buckets")
        client = BucketClient(server.endpoint, server.token)
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.uname().nodename}, {os.cpu_count()} cores",
            "state": "PostgreSQL" if args.database else "SQLite",
            "replicas": args.replicas,
        }
        try:
            # Each part is written as soon as it ends: a run cut during the uploads (a device call's limit) keeps
            # the fleet's figures (2026-12-06: the PostgreSQL case lost them so).
            result["fleet"] = fleet(client, work, args)
            _write(result, args.out)
            result["uploads"] = uploads(client, work, args)
        finally:
            stop_embedded_server(work / "buckets")
    print(_write(result, args.out))
    return 0


def _write(result: dict, out: Path | None) -> str:
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text + "\n")
    return text


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
    }


def _tcp_counters() -> dict[str, int]:
    """The kernel's listen-queue and reset counters (Linux /proc/net/netstat), to tell a full accept backlog from a
    service that closed its sockets."""
    wanted = {"ListenOverflows", "ListenDrops", "TCPAbortOnData", "TCPAbortOnClose", "TCPReqQFullDrop"}
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    counters = {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        counters.update({n: int(v) for n, v in zip(names.split()[1:], values.split()[1:], strict=False) if n in wanted})
    return counters


def _cores_over(start: float, end: float, names: dict[int, str]) -> dict[str, float | str]:
    """Cores each kind of process used from `start` to `end` (wall clock; CPU seconds per second): the services
    named by pid in `names`, the simulated fleet's processes, PostgreSQL's, and this one (the operator or the
    uploaders). What saturates first, the services or the load generator, is what this says."""
    time.sleep(max(0.0, start - time.time()))
    try:
        before = _cpu_by_kind(names)
        time.sleep(max(0.0, end - time.time()))
        after = _cpu_by_kind(names)
    except Exception as error:  # noqa: BLE001 - a diagnostic: its failure must not cost the run's figures
        return {"not measured": repr(error)[:200]}
    seconds = max(end - start, 1e-9)
    return {kind: round((used - before.get(kind, 0.0)) / seconds, 2) for kind, used in sorted(after.items())}


def _cpu_by_kind(names: dict[int, str]) -> dict[str, float]:
    import psutil  # lerobot's accelerate brings it; only the benchmarks read it

    me, used = os.getpid(), {}
    for proc in psutil.process_iter():
        try:
            line = " ".join(proc.cmdline())
            if proc.pid in names:
                kind = names[proc.pid]
            elif proc.pid == me:
                kind = "this process"
            elif proc.name() == "postgres" or line.startswith("postgres"):
                kind = "postgres"
            elif "services.bucket" in line or "services.deploy" in line:  # the embedded bucket server, say
                kind = "other services"
            elif "multiprocessing" in line and proc.ppid() == me:
                kind = "fleet processes"
            else:
                continue
            used[kind] = used.get(kind, 0.0) + sum(proc.cpu_times()[:2])
        except psutil.Error:  # gone meanwhile
            continue
    return used


def _keep_logs(work: Path, out: Path | None, replicas: int) -> None:
    """Copy each deploy service's log beside --out (the temporary folder goes with the run)."""
    import shutil

    for i in range(replicas if out else 0):
        log = work / f"deploy{i}" / "deploy.log"
        if log.exists():
            shutil.copy(log, out.with_name(f"{out.stem}_deploy{i}.log"))


def fleet(client: BucketClient, work: Path, args) -> dict:
    database = ("--database", args.database) if args.database else ()
    services = [start_local_deploy_service(work / f"deploy{i}", OPS, extra_args=database) for i in range(args.replicas)]
    ops = DeployClient(services[0].url, OPS)  # promotions through the first: the others follow through the database
    key = work / "keys" / "deploy.key"
    generate_keypair(key)
    ckpt = make_tiny_checkpoint(work / "ckpt")
    names = [f"load-v{i}" for i in range(int(args.seconds // 5) + 2)]
    client.create_bucket(BucketUrl.parse(RUN))
    for step, name in enumerate(names, start=1):
        url = BucketUrl.parse(f"{RUN}/checkpoints/{step:06d}")
        client.upload(ckpt, url / "pretrained_model")
        # no ONNX export: these robots are assigned releases, never load them (an export took ~6 s a release here)
        publish(client, str(url), name, load_private_key(key), ops, channel=None, onnx="off")
    ops.promote("stable", names[0])
    robots = [(i, f"robot-{i:03d}") for i in range(args.robots)]
    robots = [(i, name, ops.register_robot(name, channel="stable")) for i, name in robots]
    urls = [s.url for s in services]
    # The fleet in --fleet-procs processes, robot i in process i mod N (one asyncio loop and one httpx client each):
    # one process's loop tops out at a few hundred requests a second, and a saturated generator measures itself.
    start = time.time() + 5.0  # every process started and connected by then
    end = start + args.seconds
    counters_before = _tcp_counters()
    named = {s.proc.pid: f"deploy{i}" for i, s in enumerate(services)}
    try:
        with (
            ProcessPoolExecutor(args.fleet_procs, mp_context=multiprocessing.get_context("spawn")) as pool,
            ThreadPoolExecutor(1) as sampler,
        ):
            cores = sampler.submit(_cores_over, start, end, named)
            parts = [
                pool.submit(_fleet_part, urls, robots[k :: args.fleet_procs], start, end)
                for k in range(args.fleet_procs)
            ]
            promoted, promote_lat, promote_failed = _operator(ops, names, start, end)
            results = [part.result() for part in parts]
    finally:
        for service in services:
            service.stop()
        _keep_logs(work, args.out, len(services))
    counters = {k: v - counters_before.get(k, 0) for k, v in _tcp_counters().items()}
    beats = [b for r in results for b in r["beats"]]
    errors = [e for r in results for e in r["errors"]]
    complete = [r for r in promoted if r != names[0]]
    seen = {r: [t - promoted[r] for part in results for release, t in part["seen"] if release == r] for r in complete}
    last = max(promoted, key=promoted.get)
    return {
        "robots": len(robots),
        "fleet_procs": args.fleet_procs,
        "seconds": args.seconds,
        "heartbeats": _percentiles(beats),
        "promote": _percentiles(promote_lat),
        "promotions_failed": promote_failed,
        "errors": len(errors),
        "error_statuses": sorted(set(errors)),
        "promotions": len(complete),
        "fewest_robots_that_saw_a_promotion": min((len(seen[r]) for r in complete), default=len(robots)),
        "seen_after": _percentiles([s for r in complete for s in seen[r]]),
        # lost events: robots left on another release than the last one promoted, once the load was gone
        "robots_not_on_the_last_release": sum(known != last for part in results for known in part["final"].values()),
        "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "tcp_counters_during": counters,
        "cores_during": cores.result(),
    }


def _operator(
    ops: DeployClient, names: list[str], start: float, end: float
) -> tuple[dict[str, float], list[float], list[str]]:
    """A new release promoted on the fleet's channel every 5 s: when each was promoted (wall clock), how long each
    promotion took, and the promotions that failed (the service's answer: an error of the run, not its end)."""
    promoted, latencies, failed = {names[0]: start}, [], []
    for i, name in enumerate(names[1:], start=1):
        time.sleep(max(0.0, start + 5.0 * i - time.time()))
        if time.time() >= end - 5:
            break
        t0 = time.time()
        try:
            ops.promote("stable", name, "load test")
        except RobotloopError as error:
            failed.append(f"{name}: {error}")
            continue
        promoted[name] = time.time()
        latencies.append(promoted[name] - t0)
    return promoted, latencies, failed


def _fleet_part(urls: list[str], robots: list[tuple[int, str, str]], start: float, end: float) -> dict:
    """One process's robots from `start` to `end` (wall clock): heartbeat latencies, error statuses, and each
    assignment change as (release, when seen)."""
    return asyncio.run(_fleet_run(urls, robots, start, end))


async def _fleet_run(urls: list[str], robots: list[tuple[int, str, str]], start: float, end: float) -> dict:
    beats, errors, seen, final = [], [], [], {}
    await asyncio.sleep(max(0.0, start - time.time()))

    async def robot(i: int, name: str, token: str) -> None:
        auth, known = {"authorization": f"Bearer {token}"}, None
        # Each robot has its own client and two connections (its long-poll and its heartbeat), as a real robot does.
        # One client shared by the process's robots was the bottleneck: httpcore scans its whole pool on every
        # request, so with 250 connections each request cost ~10 ms of the generator's CPU (2026-12-05, 2 cores:
        # the fleet's processes at 100% of their core, the deploy service at 20%).
        async with httpx.AsyncClient(base_url=urls[i % len(urls)], headers=auth, timeout=60) as client:

            async def heartbeats() -> None:
                while time.time() < end:
                    t0 = time.monotonic()
                    r = await _send(
                        client, "POST", f"/v1/robots/{name}/heartbeat", json={"running": known, "status": {}}
                    )
                    if r is None:
                        errors.append(0)
                    elif r.status_code == 200:
                        beats.append(time.monotonic() - t0)
                    else:
                        errors.append(r.status_code)
                    await asyncio.sleep(2.0)

            task = asyncio.create_task(heartbeats())
            while time.time() < end:
                r = await _poll_assignment(client, name, known)
                if r is None or r.status_code != 200:
                    errors.append(0 if r is None else r.status_code)
                    await asyncio.sleep(1.0)
                    continue
                release = r.json().get("release")
                if release != known:
                    seen.append((release, time.time()))
                known = release
            await task
            # Then the robot settles: it polls until a whole long-poll brings no change (or SETTLE_S pass), so its
            # last release is what the fleet's replicas hand out once the load is gone. Each robot must end on the
            # operator's last promotion: a robot may skip a release promoted while it was busy (it is assigned the
            # newer one), but none may be left on an older one.
            while time.time() < end + SETTLE_S:
                r = await _poll_assignment(client, name, known)
                if r is None or r.status_code != 200:
                    await asyncio.sleep(1.0)
                    continue
                if r.json().get("release") == known:
                    break
                known = r.json().get("release")
                seen.append((known, time.time()))
            final[name] = known

    await asyncio.gather(*(robot(i, n, t) for i, n, t in robots))
    return {"beats": beats, "errors": errors, "seen": seen, "final": final}


async def _poll_assignment(client: httpx.AsyncClient, robot: str, known: str | None) -> httpx.Response | None:
    """The robot's assignment, long-polled 5 s (it answers at once when it differs from `known`)."""
    params = {"wait_s": 5.0, **({"known": known} if known else {})}
    return await _send(client, "GET", f"/v1/robots/{robot}/assignment", params=params)


async def _send(client: httpx.AsyncClient, method: str, path: str, **kwargs) -> httpx.Response | None:
    """The answer; None when there was none (a connection the server dropped, a timeout): an error the figures
    count as status 0, where it once ended the whole run with the fleet's other requests in flight."""
    try:
        return await client.request(method, path, **kwargs)
    except httpx.HTTPError:
        return None


def _bucket_servers(client: BucketClient, work: Path, args) -> tuple[list[BucketClient], list]:
    """The clients uploads go through: the embedded server's, or --replicas bucket servers over one root on
    --database (their processes returned to be stopped)."""
    if args.database is None:
        return [client], []
    tokens = work / "bucket.tokens"
    tokens.write_text(f"{OPS} write *\n")
    clients, procs = [], []
    for i in range(args.replicas):
        port = free_port()
        argv = ["--root", str(work / "shared-root"), "--port", str(port), "--tokens", str(tokens)]
        argv += ["--database", args.database]
        url = f"http://127.0.0.1:{port}"

        def answers(url: str = url) -> bool:
            try:
                return httpx.get(f"{url}/api/whoami-v2", headers={"authorization": f"Bearer {OPS}"}).is_success
            except httpx.HTTPError:
                return False

        procs.append(start_service_process("services.bucket", argv, work / f"bucket{i}.log", answers, 60))
        clients.append(BucketClient(url, OPS))
    return clients, procs


def uploads(client: BucketClient, work: Path, args) -> dict:
    base = BucketUrl.parse("hf://buckets/bench/load-uploads")
    clients, procs = _bucket_servers(client, work, args)
    try:
        return _uploads(clients, procs, base, work, args)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


def _uploads(clients: list[BucketClient], procs: list, base: BucketUrl, work: Path, args) -> dict:
    clients[0].create_bucket(base)
    end = time.monotonic() + args.seconds
    acked: list[tuple[BucketUrl, str]] = []
    latencies, errors = [], []
    lock = threading.Lock()

    def uploader(i: int) -> None:
        rng, n = random.Random(i), 0
        folder = work / f"up-{i}"
        folder.mkdir()
        while time.monotonic() < end:
            data = rng.randbytes(rng.randint(200_000, 2_000_000))
            path = folder / f"f{n}.bin"
            path.write_bytes(data)
            url = base / f"u{i}" / f"f{n}.bin"
            t0 = time.monotonic()
            try:
                clients[i % len(clients)].upload(path, url)
            except Exception as error:  # noqa: BLE001 - counted, the figure says how many
                with lock:
                    errors.append(repr(error)[:200])
            else:
                with lock:
                    latencies.append(time.monotonic() - t0)
                    acked.append((i, url, hashlib.sha256(data).hexdigest()))
            path.unlink()
            n += 1

    named = {proc.pid: f"bucket{i}" for i, proc in enumerate(procs)}
    with ThreadPoolExecutor(1) as sampler:
        cores = sampler.submit(_cores_over, time.time(), time.time() + args.seconds, named)
        threads = [threading.Thread(target=uploader, args=(i,)) for i in range(args.uploaders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def matches(item: tuple[int, BucketUrl, str]) -> bool:
        i, url, digest = item
        reader = clients[(i + 1) % len(clients)]  # another server than the one it went through, when there are two
        size = reader.stat(url).size
        return hashlib.sha256(reader.read_range(url, 0, size)).hexdigest() == digest

    # Read back as many at once as were written: one at a time, the PostgreSQL case's read-back was still going
    # 7 minutes after its window when the device call ended (2026-12-06, 16 cores).
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.uploaders) as readers:
        mismatched = sum(not ok for ok in readers.map(matches, acked))
    read_back_s = time.monotonic() - t0
    listings = [
        sorted((e.url.path, e.xet_hash) for e in c.ls(base, recursive=True) if isinstance(e, Entry)) for c in clients
    ]
    return {
        "uploaders": args.uploaders,
        "seconds": args.seconds,
        "uploads": _percentiles(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "acknowledged": len(acked),
        "read_back_mismatched": mismatched,
        "read_back_s": round(read_back_s, 1),
        "listed": len(listings[0]),
        "listings_equal": all(listing == listings[0] for listing in listings),
        "cores_during": cores.result(),
    }


if __name__ == "__main__":
    raise SystemExit(main())
