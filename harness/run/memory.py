"""Process memory: RSS now and the RSS high-water mark since the last reset.

On Linux the kernel keeps the high-water mark (VmHWM) and `echo 5 > /proc/self/clear_refs`
resets it, so measuring costs nothing inside the timed loop. Elsewhere a sampling thread
keeps the maximum.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psutil

from harness.core.units import MB

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def _vm_hwm_mb() -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        return None
    return None


class PeakRss:
    """RSS high-water mark between reset() and peak_mb()."""

    def __init__(self, sample_interval_s: float = 0.005) -> None:
        self._interval = sample_interval_s
        self._sampled_peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.method = "vmhwm" if self._kernel_reset() else "sampling"

    @staticmethod
    def _kernel_reset() -> bool:
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            return False
        return _vm_hwm_mb() is not None

    def reset(self) -> None:
        if self.method == "vmhwm":
            self._kernel_reset()
            return
        self.stop()
        self._sampled_peak = rss_mb()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self._sampled_peak = max(self._sampled_peak, rss_mb())

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def peak_mb(self) -> float:
        if self.method == "vmhwm":
            return _vm_hwm_mb() or rss_mb()
        self.stop()
        return max(self._sampled_peak, rss_mb())


def nvml_used_mb(device_index: int = 0) -> float | None:
    """Device-wide used memory from NVML (all processes), or None without NVIDIA's library.

    ONNX Runtime's CUDA EP allocates outside torch's allocator, so torch's counters cannot see
    it; NVML can. It is a device-wide reading, recorded as such, not a per-process peak.
    """
    try:
        import pynvml  # nvidia-ml-py, the `cuda` extra
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used / MB
    except pynvml.NVMLError:
        return None
