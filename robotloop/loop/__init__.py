"""The loop: record, train, publish, run, evaluate, report (`robotloop loop`)."""

from .pipeline import LoopReport, LoopSettings, run_loop
from .report import write_report

__all__ = ["LoopReport", "LoopSettings", "run_loop", "write_report"]
