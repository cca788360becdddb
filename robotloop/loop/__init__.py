"""The loop: record, train, publish, run, evaluate, report (`robotloop loop`)."""

# Lazy (PEP 562): `robotloop.loop.options` (the CLI's flags) is read without loading torch; the pipeline loads
# with the first name that needs it.
_LAZY = {
    "LoopReport": "pipeline",
    "LoopSettings": "pipeline",
    "run_loop": "pipeline",
    "write_report": "report",
    "LoopOptions": "options",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"robotloop.loop.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'robotloop.loop' has no attribute {name!r}")


__all__ = ["LoopOptions", "LoopReport", "LoopSettings", "run_loop", "write_report"]
