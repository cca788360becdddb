"""Where a round's fleet robots spend the time before their first action (issue 29: a round in 5 minutes).

Everything real, on localhost, as `robotloop loop --rounds` starts its fleet: the embedded bucket server (a temporary
root), the deploy service, one signed release of a freshly built ACT (random weights: only timing matters) on
channel stable, and N sim robots started at once (`robotloop.rounds.fleet.run_fleet`: a process each, recording into
its own fleet dataset), each running one short episode. Printed and written, per robot: seconds from the fleet's
start until its code ran, its assignment arrived, its release was pulled and checked, loaded and warmed up, and its
first episode ended; and the medians.

    MUJOCO_GL=egl .venv/bin/python benchmarks/fleet_start.py --robots 2 --image-size 120x160      # default-size ACT
    MUJOCO_GL=egl python3 benchmarks/fleet_start.py --robots 10 --image-size 240x320 --device cuda  # the h200 preset's

`--early-server` starts the robots' fork server before the release is built (as `robotloop loop --rounds` starts it
before round 0): the fleet's wall time then leaves out the server's imports.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from fleet_rate import RUN, release, write_out  # benchmarks/: the same release as the control-rate benchmark's

from robotloop.deploy.client import DeployClient
from robotloop.deploy.keys import public_path
from robotloop.deploy.local import start_local_deploy_service
from robotloop.output import log_to_console, quiet_encoders
from robotloop.rounds.fleet import FleetRobot, run_fleet, start_fork_server
from robotloop.sim.constants import parse_image_size
from robotloop.storage import BucketClient, BucketUrl
from robotloop.storage.embedded import ensure_embedded_server, stop_embedded_server

OPS = "bench-ops"
MARKS = ("running", "assigned", "pulled", "loaded", "ready", "episodes_done", "closed")


def robots(work: Path, ops: DeployClient, endpoint: str, token: str, args: argparse.Namespace) -> list[FleetRobot]:
    trusted = public_path(work / "deploy.key").read_text()
    return [
        FleetRobot(
            robot_id=f"start-{i}",
            token=ops.register_robot(f"start-{i}", channel="stable", rotate=True),
            deploy_url=ops.url,
            endpoint=endpoint,
            storage_token=token,
            task="insertion",
            image_size=parse_image_size(args.image_size),
            shadow_map=None,
            device=args.device,
            first_seed=500_000 + 10 * i,
            episodes=1,
            policy_steps=args.steps,
            stall_steps=args.steps,  # no takeover: the episode is the policy's alone
            record_to=f"hf://buckets/bench/fleet/datasets/start-{i}",
            vcodec="h264",
            store=work / "stores" / f"start-{i}",
            trusted_keys=trusted,
            rate_hz=math.inf,
        )
        for i in range(args.robots)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robots", type=int, default=2)
    parser.add_argument("--image-size", default="120x160")
    parser.add_argument("--tiny", action="store_true", help="the tiny ACT; default: lerobot's default size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20, help="the policy's ticks in each robot's one episode")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--early-server",
        action="store_true",
        help="start the robots' fork server before the release is built, as `run_rounds` does before round 0",
    )
    args = parser.parse_args()
    if args.early_server:
        start_fork_server()
    quiet_encoders()
    log_to_console()
    work = Path(tempfile.mkdtemp(prefix="fleet-start-"))
    root = work / "buckets"
    server = ensure_embedded_server(root)
    service = start_local_deploy_service(work / "deploy", OPS)
    try:
        bucket, ops = BucketClient(server.endpoint, server.token), DeployClient(service.url, OPS)
        bucket.create_bucket(BucketUrl.parse(RUN))
        release(work, bucket, ops, parse_image_size(args.image_size), args.tiny, args.device, channel="stable")
        fleet = robots(work, ops, server.endpoint, server.token, args)
        t0 = time.monotonic()
        results = run_fleet(fleet, timeout_s=900)
        wall = time.monotonic() - t0
    finally:
        service.stop()
        stop_embedded_server(root, force=True)
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        {"robot": r.robot_id, "error": r.error, "backend": r.backend, "bytes_pulled": r.bytes_pulled, **r.timings}
        for r in results
    ]
    medians = {m: statistics.median(r[m] for r in rows if m in r) for m in MARKS if any(m in r for r in rows)}
    for row in rows:
        print(json.dumps(row))
    print(f"medians (s from the fleet's start): {json.dumps(medians)}; whole fleet {wall:.1f} s")
    write_out(args, rows=rows, medians=medians, wall_s=round(wall, 1))


if __name__ == "__main__":
    main()
