"""How far decoded video is from the rendered frames, per codec, at the camera's size and at the policy's.

The demos are AV1 (lerobot's default, the h200 preset's) and the fleet's robots record h264 (fast enough for a 50 Hz
robot on one core): a policy fine-tuned on both sees two slightly different pictures of the same scene. This puts a
number on it, with lerobot's encoder defaults (yuv420p, crf 30, a key frame every 2), on one scripted TransferCube
episode rendered at 480x640, each frame resized to 120x160 as the h200 preset's policy sees it (bilinear with
antialiasing, as its preprocessor resizes).

    MUJOCO_GL=egl .venv/bin/python benchmarks/codec_gap.py [--steps 120] [--seed 7]
"""

from __future__ import annotations

import argparse
import io
import json

import av
import numpy as np
import torch

from robotloop.sim.scripted import record_demo


def roundtrip(frames: np.ndarray, codec: str) -> tuple[np.ndarray, int]:
    """`frames` encoded with `codec` as lerobot would, then decoded; and the video's bytes."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream(codec, rate=50)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt, stream.options = "yuv420p", {"g": "2", "crf": "30"}
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    size = buf.tell()
    buf.seek(0)
    with av.open(buf) as video:
        return np.stack([f.to_ndarray(format="rgb24") for f in video.decode(video=0)]), size


def as_policy_sees(frames: np.ndarray) -> torch.Tensor:
    """0-255 floats at 120x160."""
    t = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    return torch.nn.functional.interpolate(t, size=(120, 160), mode="bilinear", antialias=True, align_corners=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    frames = record_demo("transfer_cube", args.seed, image_size=(480, 640), max_steps=args.steps).frames
    rendered, decoded = as_policy_sees(frames), {}
    result: dict[str, dict] = {}
    for codec in ("libsvtav1", "h264"):
        video, size = roundtrip(frames, codec)
        full = np.abs(video.astype(np.int16) - frames.astype(np.int16))
        decoded[codec] = as_policy_sees(video)
        small = (decoded[codec] - rendered).abs()
        result[codec] = {
            "bytes": size,
            "480x640_mean_abs": float(full.mean()),
            "480x640_p99": float(np.percentile(full, 99)),
            "120x160_mean_abs": float(small.mean()),
            "120x160_p99": float(np.percentile(small.numpy(), 99)),
        }
    between = (decoded["libsvtav1"] - decoded["h264"]).abs()
    result["av1_against_h264_120x160"] = {"mean_abs": float(between.mean()), "p99": float(np.percentile(between, 99))}
    print(json.dumps({"frames": len(frames), "seed": args.seed, **result}, indent=1))


if __name__ == "__main__":
    main()
