"""Energy from real sensors only: Intel/AMD RAPL via powercap on Linux CPUs, NVML on NVIDIA GPUs.

Where no sensor is readable the meter says why, and no number is recorded: never an estimate.
A sensor that fails one read during a measurement leaves no number either, and says so.
RAPL package counters cover the whole socket (other processes included), so the figure is the
machine's energy during the timed loop divided by the items processed; details say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyReading:
    joules: float | None
    source: str  # "rapl:<domains>", "nvml:<index>", "unsupported: <reason>" or "not measured: <reason>"


def _rapl_domains() -> list[Path]:
    """Top-level package domains (intel-rapl:0, intel-rapl:1, …), not their subdomains."""
    if not POWERCAP.is_dir():
        return []
    return sorted(p for p in POWERCAP.glob("intel-rapl:*") if p.name.count(":") == 1)


class EnergyMeter:
    """start() … stop() around a timed loop; stop() returns the energy used in between."""

    def __init__(self, nvidia_device: int | None = None) -> None:
        self.nvidia_device = nvidia_device
        self.domains = _rapl_domains()
        self._start: list[int] | None = None
        self.unavailable = self._why_unavailable()

    def _why_unavailable(self) -> str | None:
        if self.nvidia_device is not None:
            return None if self._nvml_mj() is not None else "NVML energy counter not readable (nvidia-ml-py missing?)"
        if not self.domains:
            return f"no RAPL domains under {POWERCAP} (not Linux on Intel/AMD, or not exposed in this VM)"
        try:
            self._read_rapl()
        except OSError as exc:
            return f"RAPL not readable: {exc.strerror} ({exc.filename}); reading it needs root on recent kernels"
        return None

    def _read_rapl(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def _nvml_mj(self) -> int | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(self.nvidia_device))
        except Exception:  # ImportError or any NVML error: the counter is not available
            return None

    def _read(self) -> list[int] | None:
        """The counters now (NVML: one, in mJ; RAPL: one per domain, in µJ), or None if a read failed."""
        if self.nvidia_device is not None:
            energy = self._nvml_mj()
            return None if energy is None else [energy]
        try:
            return self._read_rapl()
        except OSError:
            return None

    def start(self) -> None:
        if self.unavailable:
            return
        self._start = self._read()

    def stop(self) -> EnergyReading:
        if self.unavailable:
            return EnergyReading(None, f"unsupported: {self.unavailable}")
        before, after = self._start, self._read()
        # A failed read leaves no number: a missing end is not zero joules, and a missing start is
        # not the energy since the counter began.
        if before is None or after is None:
            sensor, when = "NVML" if self.nvidia_device is not None else "RAPL", "start" if before is None else "end"
            return EnergyReading(
                None, f"not measured: the {sensor} energy counter failed to read at the {when} of the loop"
            )
        if self.nvidia_device is not None:
            return EnergyReading((after[0] - before[0]) / 1000.0, f"nvml:{self.nvidia_device}")
        joules = 0.0
        for domain, first, last in zip(self.domains, before, after, strict=True):
            delta = last - first
            if delta < 0:  # the counter wrapped around
                delta += int((domain / "max_energy_range_uj").read_text())
            joules += delta / 1e6
        return EnergyReading(joules, "rapl:" + ",".join(d.name for d in self.domains))
