"""Video encoding alone, h264 against lerobot's default libsvtav1, side by side (issue 27: the cpu preset's codec).

Renders one scripted TransferCube demo's `top` camera at each size, then encodes its frames with PyAV exactly as
lerobot's encoder does (lerobot's own `RGBEncoderConfig` options for each codec), the codecs taking turns, and prints
the median seconds per episode, the ratio and the bytes per episode.

    MUJOCO_GL=egl .venv/bin/python benchmarks/codec.py --sizes 48x64 120x160 --turns 5
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import av
from lerobot.configs.video import RGBEncoderConfig

from robotloop.output import quiet_libraries
from robotloop.sim.constants import format_image_size, parse_image_size
from robotloop.sim.scripted import record_demo

quiet_libraries()  # SVT-AV1's banner, ~25 lines per encoder

CODECS = ("h264", "libsvtav1")


def encode(frames, vcodec: str, fps: int = 50) -> tuple[float, int]:
    """Seconds and bytes to encode `frames` (uint8 [T, H, W, 3]) into an in-memory mp4, as lerobot encodes."""
    config = RGBEncoderConfig(vcodec=vcodec)
    buffer = io.BytesIO()
    t0 = time.perf_counter()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream(config.vcodec, fps, options=config.get_codec_options(None, as_strings=True))
        stream.pix_fmt, stream.height, stream.width = config.pix_fmt, frames.shape[1], frames.shape[2]
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return time.perf_counter() - t0, buffer.getbuffer().nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["48x64", "120x160"])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the table as JSON here")
    args = parser.parse_args()
    rows = []
    for size in map(parse_image_size, args.sizes):
        frames = record_demo("transfer_cube", seed=0, image_size=size).frames
        seconds: dict[str, list[float]] = {c: [] for c in CODECS}
        sizes: dict[str, int] = {}
        for _ in range(args.turns):
            for codec in CODECS:
                s, nbytes = encode(frames, codec)
                seconds[codec].append(s)
                sizes[codec] = nbytes
        med = {c: statistics.median(v) for c, v in seconds.items()}
        row = {"size": format_image_size(size), "frames": len(frames), "median_s": med, "bytes": sizes}
        row["h264_speedup"] = med["libsvtav1"] / med["h264"]
        rows.append(row)
        print(
            f"{row['size']}: h264 {med['h264']:.3f} s, libsvtav1 {med['libsvtav1']:.3f} s per {len(frames)}-frame "
            f"episode (h264 {row['h264_speedup']:.2f}x faster); bytes h264 {sizes['h264']:,}, "
            f"libsvtav1 {sizes['libsvtav1']:,}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
