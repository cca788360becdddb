"""FP8 (issue 6): does TorchAO float8 keep ACT's training loss, and is it faster than bf16?

Run (GPU, all of it):  .venv/bin/python benchmarks/fp8.py --out fp8.json
    In pieces (each configuration compiles for minutes): --skip speed (parity only), --skip parity
    --cases large-b128 (one speed case), --modes off tensorwise (some configurations), --parity-eager.
    Side by side (one process per configuration, all at once on the one GPU; compile is CPU work, so they compile
    together, then each is timed alone, in `--rounds` turns taken in a ring): --parity-side-by-side,
    --speed-side-by-side. A mode named twice (`--modes off off auto`) runs twice: a second "off" is the run's
    own noise, the yardstick for "not slower beyond noise".
Smoke (CPU):           .venv/bin/python benchmarks/fp8.py --quick
    (tiny ACT, a few steps, no compile; explicit recipes are reported as skipped and "auto" falls back to
    bf16, since this CPU has no FP8: it checks the script's control flow, not FP8)

Every configuration is robotloop's fast step (`ACTSettings.fast()`: bf16 autocast, fused attention,
channels_last, torch.compile + CUDA graphs, fused AdamW) with `fp8` set to "off" (the bf16 baseline),
"tensorwise", "rowwise", "rowwise_with_gw_hp" or "auto".

1. Parity: `--parity-steps` steps (default 2000) at batch `--parity-batch` on the same synthetic but learnable
   data (a fixed pool of samples whose action chunks are a fixed function of the state, sampled in the same
   seeded order) from the same initial weights (same seed). "final loss" is the mean of the last 100 step
   losses; the target is |fp8 - bf16| / bf16 <= 5%.
2. Speed, side by side in one run: lerobot's default ACT (51.6M) at batch 8 and 64, and a large ACT
   (dim_model 1024, dim_feedforward 4096, 6 encoder layers) at batch 128; one 480x640 camera, synthetic
   batches already on the GPU (benchmarks/act_step.py's). The first step is timed alone: it holds compile (and
   "auto"'s shape measurement, unless its cache is warm). Then `--warmup` and `--steps` timed steps; samples/s
   is batch / median step. Target: FP8 >= 1.15x bf16 on the large ACT.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from act_step import ACTION_DIM, CAM, STATE_DIM, features, make_batch, stats, time_steps

from robotloop.train.fp8 import FP8_RECIPES, Fp8Unavailable
from robotloop.train.policy import TINY_ACT, ACTSettings, TrainablePolicy, build_policy

MODES = ("off", *FP8_RECIPES, "auto")
PARITY_TOLERANCE = 0.05
SPEED_TARGET = 1.15
LOSS_TAIL = 100  # steps averaged into the "final loss"


@dataclass(frozen=True)
class Case:
    """One model size at one batch size."""

    name: str
    batch: int
    arch: dict


DEFAULT_ACT: dict = {}
LARGE_ACT = {"dim_model": 1024, "dim_feedforward": 4096, "n_encoder_layers": 6}
CASES = {
    "default-b8": Case("default", 8, DEFAULT_ACT),
    "default-b64": Case("default", 64, DEFAULT_ACT),
    "large-b128": Case("large", 128, LARGE_ACT),
}


def learnable_pool(n: int, chunk: int, h: int, w: int, device: torch.device) -> dict[str, torch.Tensor]:
    """`n` samples whose action chunk is a fixed smooth function of the state (and the image's mean
    brightness), so the loss falls steadily and two precisions can be compared on it."""
    g = torch.Generator().manual_seed(1234)
    state = torch.randn(n, STATE_DIM, generator=g)
    brightness = torch.rand(n, generator=g)
    images = (brightness.view(n, 1, 1, 1) * 200 + torch.rand(n, 3, h, w, generator=g) * 55).to(torch.uint8)
    mix = torch.randn(STATE_DIM, ACTION_DIM, generator=g) / STATE_DIM**0.5
    ramp = torch.linspace(0, 1, chunk).view(1, chunk, 1)
    action = torch.tanh(state @ mix).unsqueeze(1) * (1 - ramp) + brightness.view(n, 1, 1) * ramp
    pool = {
        CAM: images,
        "observation.state": state,
        "action": action,
        "action_is_pad": torch.zeros(n, chunk, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in pool.items()}


def build(mode: str, arch: dict, h: int, w: int, device: torch.device, fast: bool) -> TrainablePolicy:
    torch.manual_seed(0)  # the same initial weights in every configuration
    base = ACTSettings.fast(**arch) if fast else ACTSettings(precision="bf16", fused_attention=True, **arch)
    return build_policy(features(h, w), stats(), replace(base, fp8=mode), device)


def parity_run(mode: str, args, device: torch.device, fast: bool) -> dict:
    arch = TINY_ACT if args.quick else DEFAULT_ACT
    chunk = arch.get("chunk_size", ACTSettings().chunk_size)
    h, w = args.hw
    pool = learnable_pool(args.pool, chunk, h, w, device)
    tp = build(mode, {**arch, "lr": 1e-4, "lr_backbone": 1e-5}, h, w, device, fast)
    order = torch.Generator().manual_seed(99)
    losses = []
    t0 = time.perf_counter()
    for _ in range(args.parity_steps):
        idx = torch.randint(0, args.pool, (args.parity_batch,), generator=order).to(device)
        losses.append(tp.train_step({k: v[idx] for k, v in pool.items()}))
    values = [float(x) for x in losses]  # one host sync, after the run
    tail = values[-min(LOSS_TAIL, len(values)) :]
    return {
        "mode": mode,
        "steps": len(values),
        "first_loss": round(values[0], 4),
        "final_loss": round(statistics.fmean(tail), 4),
        "wall_s": round(time.perf_counter() - t0, 1),
        "fp8_layers": len(tp.fp8_layers),
    }


class Gate:
    """Side by side without sharing the GPU while timed: every process compiles at once (compile is CPU work), says
    it is ready, waits until all are ready (or gone), then times its steps in `rounds` turns, the processes taking
    turns in a fixed ring (0, 1, ..., 0, 1, ...): a drift of the machine over the minutes of timing (clocks,
    another process's teardown, a passing load) then falls on every configuration alike instead of on whichever
    happened to go last. A process leaves only once every turn is done, so no exit runs beside a timed turn."""

    def __init__(self, folder: Path, total: int, index: int, rounds: int = 1, timeout_s: float = 1800.0) -> None:
        self.folder, self.total, self.index, self.rounds, self.timeout_s = folder, total, index, rounds, timeout_s
        self.ticket_file = folder / "ticket"  # the turn under way: round * total + index; no "-" in its name

    def turns(self):
        """Yield once per turn, `rounds` times, each while this process alone holds the GPU."""
        (self.folder / f"ready-{self.index}").touch()
        deadline = time.monotonic() + self.timeout_s
        while len({f.name.split("-", 1)[1] for f in self.folder.glob("*-*")}) < self.total:  # ready or gone
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for r in range(self.rounds):
            mine = r * self.total + self.index
            self._wait_for(mine)
            try:
                yield r
            finally:
                self._advance(mine + 1)
        self._wait_for(self.rounds * self.total)  # every turn done: leave

    def _gone(self, ticket: int) -> bool:
        return (self.folder / f"gone-{ticket % self.total}").exists()

    @contextmanager
    def _locked(self):
        with open(self.folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _wait_for(self, ticket: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            with self._locked():
                now = int(self.ticket_file.read_text() or 0) if self.ticket_file.exists() else 0
                while now < ticket and self._gone(now):  # a process that died holds no turn
                    now += 1
                    self.ticket_file.write_text(str(now))
                if now >= ticket:
                    return
            time.sleep(0.05)

    def _advance(self, ticket: int) -> None:
        with self._locked():
            self.ticket_file.write_text(str(ticket))


def speed_run(mode: str, case: Case, args, device: torch.device, fast: bool) -> dict:
    h, w = args.hw
    tp = build(mode, case.arch, h, w, device, fast)
    chunk = tp.settings.chunk_size
    batch = make_batch(case.batch, chunk, h, w, device)
    first = time_steps(tp.train_step, batch, 1, device)[0]  # compile (and auto's measurement) included
    time_steps(tp.train_step, batch, args.warmup, device)
    rounds = args.gate.rounds if args.gate else 1
    times = []
    for _ in args.gate.turns() if args.gate else [0]:
        time_steps(tp.train_step, batch, args.warmup, device)  # the GPU was shared (or idle) until now
        times += time_steps(tp.train_step, batch, max(1, args.steps // rounds), device)
    med = statistics.median(times)
    row = {
        "case": case.name,
        "batch": case.batch,
        "mode": mode,
        "samples_per_s": round(case.batch / med, 1),
        "median_step_ms": round(med * 1e3, 2),
        "first_step_s": round(first, 1),
        "fp8_layers": len(tp.fp8_layers),
        "timed_turns": rounds,
    }
    if tp.fp8_step_timing is not None:  # "auto": its eager whole-step check, bf16 against the chosen layers in FP8
        row["auto_step_ms"] = asdict(tp.fp8_step_timing)
    if device.type == "cuda":
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        # A step that falls out of its CUDA graphs pays every kernel launch again: at batch 8 that is most of it.
        row["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    return row


def parity_side_by_side(args) -> list[dict]:
    """Each mode's parity run in its own process, all at once on the one GPU: a loss does not depend on what else
    runs beside it, and the runs take the time of one."""
    passed = [
        "--parity-steps",
        str(args.parity_steps),
        "--parity-batch",
        str(args.parity_batch),
        "--pool",
        str(args.pool),
        "--image",
        args.image,
        *(["--parity-eager"] if args.parity_eager else []),
        *(["--inductor", *args.inductor] if args.inductor else []),
        *(["--quick"] if args.quick else []),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [(mode, Path(tmp) / f"{mode}.json") for mode in args.modes]
        running = [
            subprocess.Popen(
                [sys.executable, __file__, "--skip", "speed", "--modes", mode, "--out", str(out), *passed],
                stdout=subprocess.DEVNULL,
            )
            for mode, out in procs
        ]
        for p in running:
            p.wait()
        return [
            json.loads(out.read_text())["parity"][0] if out.exists() else {"mode": mode, "error": "no output"}
            for mode, out in procs
        ]


def speed_side_by_side(args, cases: list[Case]) -> list[dict]:
    """Every (case, mode) in its own process, compiling at once; `Gate` times them one at a time."""
    key = {c.name + str(c.batch): k for k, c in CASES.items()}  # --quick's tiny case has none
    jobs = [(case, mode) for case in cases for mode in args.modes]
    with tempfile.TemporaryDirectory() as tmp:
        gate = Path(tmp)
        procs = []
        for i, (case, mode) in enumerate(jobs):
            out = gate / f"out{i}.json"
            which = ["--cases", key[case.name + str(case.batch)]] if not args.quick else []
            cmd = [
                sys.executable,
                __file__,
                "--skip",
                "parity",
                *which,
                "--modes",
                mode,
                "--out",
                str(out),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--image",
                args.image,
                "--gate",
                f"{gate}:{len(jobs)}:{i}",
                "--rounds",
                str(args.rounds),
                *(["--inductor", *args.inductor] if args.inductor else []),
                *(["--quick"] if args.quick else []),
            ]
            procs.append((case, mode, out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL)))
        for *_, p in procs:  # waits in launch order; one that dies early is marked gone at once
            while p.poll() is None:
                for i, (*_, q) in enumerate(procs):
                    if q.poll() is not None:
                        (gate / f"gone-{i}").touch()
                time.sleep(1.0)
        rows = []
        for case, mode, out, p in procs:
            found = json.loads(out.read_text())["speed"] if out.exists() else []
            rows.append(
                found[0]
                if found
                else {"case": case.name, "batch": case.batch, "mode": mode, "error": f"exit {p.returncode}, no output"}
            )
        return rows


def set_inductor(settings: list[str]) -> None:
    """Apply `--inductor` entries ("triton.prefer_nd_tiling=True") to torch._inductor.config.

    Raises:
        SystemExit: an entry without "=", or naming no such setting (a typo would otherwise be a silent no-op).
    """
    import ast

    import torch._inductor.config as inductor_config

    for entry in settings:
        key, sep, text = entry.partition("=")
        if not sep:
            raise SystemExit(f"--inductor {entry!r}: expected KEY=VALUE")
        *parents, name = key.split(".")
        target = inductor_config
        for part in parents:
            target = getattr(target, part, None)
        if target is None or not hasattr(target, name):
            raise SystemExit(f"--inductor {entry!r}: torch._inductor.config has no {key!r}")
        setattr(target, name, ast.literal_eval(text))


def guarded(fn, mode: str, *rest) -> dict:
    """Run one configuration; a device without FP8 is a skip, any other failure an error row."""
    try:
        return fn(mode, *rest)
    except Fp8Unavailable as e:
        return {"mode": mode, "skipped": str(e)}
    except Exception as e:  # noqa: BLE001 - keep the table going; the failure is reported in it
        return {"mode": mode, "error": f"{type(e).__name__}: {e}"[:500]}
    finally:
        gc.collect()
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def verdicts(parity: list[dict], speed: list[dict]) -> dict:
    """Parity within 5% of bf16's final loss; speed-up over bf16 per case (target 1.15x on the large ACT)."""
    base = next((r["final_loss"] for r in parity if r["mode"] == "off" and "final_loss" in r), None)
    out: dict = {"parity": {}, "speedup": {}}
    for r in parity:
        if r["mode"] != "off" and "final_loss" in r and base:
            rel = abs(r["final_loss"] - base) / base
            out["parity"][r["mode"]] = {"relative_diff": round(rel, 4), "ok": rel <= PARITY_TOLERANCE}
    bf16: dict = {}  # (case, batch) -> the first "off" row's samples/s: the baseline
    seen: Counter = Counter()  # rows so far per (case, batch, mode): a mode given twice (`--modes off off auto`)
    for r in speed:
        if "samples_per_s" not in r:
            continue
        key = (r["case"], r["batch"])
        seen[(*key, r["mode"])] += 1
        n = seen[(*key, r["mode"])]
        if r["mode"] == "off" and n == 1:
            bf16[key] = r["samples_per_s"]
            continue
        if key not in bf16:
            continue
        x = r["samples_per_s"] / bf16[key]
        verdict = {"x": round(x, 3)}
        if r["case"] == "large" and r["mode"] != "off":  # a second "off" ("off #2") is the run's own noise
            verdict["meets_1.15x"] = x >= SPEED_TARGET
        if r["mode"] == "auto":  # auto must never lose to bf16 beyond noise (3%)
            verdict["not_slower"] = x >= 0.97
        out["speedup"][f"{key[0]} b{key[1]} {r['mode']}" + (f" #{n}" if n > 1 else "")] = verdict
    return out


def merge(paths: list[str]) -> dict:
    """One table from several runs of this script (each compiles for minutes, so the cases run apart): every run
    kept whole with its own verdicts (a speed-up is only ever against the bf16 row of the same run), and the
    summary verdicts taken from the latest run that measured each (case, mode)."""
    runs = []
    for path in paths:
        found = json.loads(Path(path).read_text())
        run = {k: found.get(k) for k in ("date", "device", "torch", "torchao", "image", "parity_compiled")}
        run |= {"source": Path(path).name, "parity": found["parity"], "speed": found["speed"]}
        runs.append(run | {"verdicts": verdicts(found["parity"], found["speed"])})
    latest: dict = {"parity": {}, "speedup": {}}
    for run in runs:  # in the order given: later runs win
        for kind, table in latest.items():
            table.update({k: {**v, "source": run["source"]} for k, v in run["verdicts"][kind].items()})
    return {"merged_from": [r["source"] for r in runs], "runs": runs, "verdicts": latest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--skip", nargs="*", default=[], choices=["parity", "speed"])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), help="speed cases to run")
    ap.add_argument("--parity-steps", type=int, default=2000)
    ap.add_argument("--parity-batch", type=int, default=8)
    ap.add_argument(
        "--parity-eager",
        action="store_true",
        help="parity without compile or CUDA graphs (same FP8 matmuls, minutes less per configuration)",
    )
    ap.add_argument("--parity-side-by-side", action="store_true", help="one process per mode, all at once")
    ap.add_argument(
        "--speed-side-by-side",
        action="store_true",
        help="one process per speed configuration, compiling at once, timed one at a time",
    )
    ap.add_argument(
        "--speed-waves",
        nargs="+",
        default=None,
        metavar="CASES",
        help="side by side in waves, one per argument (comma-separated cases, e.g. large-b128 default-b8,default-b64):"
        " the processes of a wave share the GPU's memory (the large ACT at batch 128 peaks at about 20 GiB each)",
    )
    ap.add_argument(
        "--gate", dest="gate_spec", default=None, help=argparse.SUPPRESS
    )  # FOLDER:TOTAL:INDEX, set by --speed-side-by-side
    ap.add_argument("--pool", type=int, default=512, help="samples in the parity data pool")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="side by side: the timed steps split into this many turns, the processes taking turns in a ring",
    )
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--image", default="480x640", help="HxW of the one camera")
    ap.add_argument(
        "--inductor",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="set torch._inductor.config entries in every process, e.g. triton.prefer_nd_tiling=True: a compiler"
        " setting tried on bf16 and FP8 alike, so the ratios stay side by side",
    )
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny ACT, 48x64, few steps, no compile")
    ap.add_argument("--out", default=None, help="also write the JSON result here")
    ap.add_argument(
        "--merge", nargs="+", metavar="RESULT", help="merge earlier results (in order, later win) into --out"
    )
    args = ap.parse_args(argv)
    if args.merge:
        text = json.dumps(merge(args.merge), indent=2)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0

    set_inductor(args.inductor)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    cases = [CASES[c] for c in args.cases]
    if args.quick:
        args.image, args.parity_steps, args.parity_batch, args.pool, args.steps, args.warmup = "48x64", 4, 2, 8, 2, 1
        cases = [Case("tiny", 2, TINY_ACT)]
    if device.type == "cuda":
        # Side by side, every process picks its convolution algorithms during its first steps, while the others
        # run theirs on the same GPU: cuDNN's benchmark would then time them under a passing load and pick at
        # random. Its heuristics pick the same ones in every process.
        torch.backends.cudnn.benchmark = args.gate_spec is None
        torch.backends.cuda.matmul.allow_tf32 = True
    args.hw = tuple(int(x) for x in args.image.split("x"))
    fast = device.type == "cuda"  # compile + CUDA graphs need a GPU

    parity, speed = [], []
    if "parity" not in args.skip and args.parity_side_by_side:
        parity = parity_side_by_side(args)
    elif "parity" not in args.skip:
        for mode in args.modes:
            parity.append(row := guarded(parity_run, mode, args, device, fast and not args.parity_eager))
            print(json.dumps({"parity": row}), file=sys.stderr, flush=True)
    args.gate = None
    if args.gate_spec:
        folder, total, index = args.gate_spec.rsplit(":", 2)
        args.gate = Gate(Path(folder), int(total), int(index), args.rounds)
    if "speed" not in args.skip and args.speed_side_by_side:
        waves = [[CASES[c] for c in w.split(",")] for w in args.speed_waves] if args.speed_waves else [cases]
        if args.quick:
            waves = [cases]
        for wave in waves:
            speed += speed_side_by_side(args, wave)
        cases = [c for wave in waves for c in wave]
    elif "speed" not in args.skip:
        for case in cases:
            for mode in args.modes:
                speed.append(
                    row := {
                        "case": case.name,
                        "batch": case.batch,
                        **guarded(speed_run, mode, case, args, device, fast),
                    }
                )
                print(json.dumps({"speed": row}), file=sys.stderr, flush=True)

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "torchao": __import__("torchao").__version__,
        "image": list(args.hw),
        "parity_compiled": fast and not args.parity_eager,
        "inductor": args.inductor,
        "cases": [asdict(c) for c in cases],
        "parity": parity,
        "speed": speed,
        "verdicts": verdicts(parity, speed),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if any("error" in r for r in parity + speed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
