"""``python -m services.trainer --tokens FILE [--root DIR] [--host 127.0.0.1] [--port 8770]``; storage from
ROBOTLOOP_* settings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robotloop.config import load_settings
from services.trainer.app import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.trainer", description="robotloop training service")
    parser.add_argument("--host", default=None, help="default: trainer.host (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default: trainer.port (8770)")
    parser.add_argument("--root", type=Path, default=None, help="job directories; default: trainer.root")
    parser.add_argument("--tokens", type=Path, default=None,
                        help="caller tokens ('<token> <read|write> <namespace|*>' per line); default: trainer.tokens_file")
    args = parser.parse_args(argv)
    settings = load_settings({"trainer": {"host": args.host, "port": args.port, "root": args.root, "tokens_file": args.tokens}})
    try:
        serve(settings)
    except (ValueError, FileNotFoundError) as err:  # no or bad tokens file, ...
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
