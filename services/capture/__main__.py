"""``python -m services.capture --tokens FILE [--host 127.0.0.1] [--port 8760]``; storage from ROBOTLOOP_* settings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robotloop.config import load_settings
from services.capture.app import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.capture", description="robotloop capture service")
    parser.add_argument("--host", default=None, help="default: capture.host (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default: capture.port (8760)")
    parser.add_argument("--tokens", type=Path, default=None,
                        help="robot tokens ('<token> write <namespace|*>' per line); default: capture.tokens_file")
    args = parser.parse_args(argv)
    settings = load_settings({"capture": {"host": args.host, "port": args.port, "tokens_file": args.tokens}})
    try:
        serve(settings)
    except (ValueError, FileNotFoundError) as err:  # no or bad tokens file, ...
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
