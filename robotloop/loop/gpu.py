"""GPU utilisation while the loop runs: NVML's busy share of the device, sampled in a thread, averaged per stage.

NVML's utilisation is the share of time in which at least one kernel ran on the device: a GPU at 100% may still
be underused (small kernels), but one well under 100% is waiting on something else (the host, data, the sim).

Example:
    ```python
    >>> with GpuMonitor("cuda") as gpu:
    ...     t0 = time.monotonic(); work(); t1 = time.monotonic()
    >>> gpu.mean([(t0, t1)])   # percent, or None without a GPU or NVML
    ```
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class GpuMonitor:
    """Samples `torch.cuda.utilization(device)` every `every_s` seconds until stopped; no-op off CUDA or NVML."""

    def __init__(self, device: str, every_s: float = 0.5) -> None:
        self.samples: list[tuple[float, int]] = []  # (monotonic time, percent)
        self._device, self._every = device, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if device.startswith("cuda") and self._read() is not None:
            self._thread = threading.Thread(target=self._run, name="loop-gpu-monitor", daemon=True)

    def _read(self) -> int | None:
        import torch

        try:
            return int(torch.cuda.utilization(self._device))
        except Exception as error:  # noqa: BLE001 - NVML missing or refusing: the report says "not measured"
            log.info("GPU utilisation not measured: %s", error)
            return None

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            if (percent := self._read()) is None:
                return
            self.samples.append((time.monotonic(), percent))

    def mean(self, spans: list[tuple[float, float]]) -> float | None:
        """Mean utilisation (percent) over the samples inside `spans` ((start, end) monotonic times); None if none."""
        inside = [p for t, p in self.samples if any(a <= t <= b for a, b in spans)]
        return sum(inside) / len(inside) if inside else None

    def __enter__(self) -> GpuMonitor:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
