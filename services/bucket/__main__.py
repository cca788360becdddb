"""``python -m services.bucket --root DIR [--host 127.0.0.1] [--port 8750] [--tokens FILE]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robotloop.errors import RobotloopError
from services.bucket.app import DEFAULT_MAX_BODY_BYTES, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.bucket", description="robotloop Xet bucket server")
    parser.add_argument("--root", type=Path, required=True, help="data directory (created if missing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8750)
    parser.add_argument(
        "--tokens",
        type=Path,
        default=None,
        help="tokens file ('<token> <read|write> <namespace|*>' per line); omit for open local mode",
    )
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    args = parser.parse_args(argv)
    try:
        serve(args.root, args.host, args.port, args.tokens, args.max_body_bytes)
    except RobotloopError as err:  # a bad or missing tokens file, open mode off loopback, a busy port
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
