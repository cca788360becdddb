"""The loop: record, train, publish, run, evaluate, report (`robotloop loop`)."""

# Lazy (PEP 562): `robotloop.loop.options` (the CLI's flags) is read without loading torch; the pipeline loads
# with the first name that needs it.
from robotloop.lazy import lazy_names

_LAZY = {
    "LoopReport": "pipeline",
    "LoopSettings": "pipeline",
    "run_loop": "pipeline",
    "write_report": "report",
    "LoopOptions": "options",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = ["LoopOptions", "LoopReport", "LoopSettings", "run_loop", "write_report"]
