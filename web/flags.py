"""How a launched browser starts: the GPU profile (--gpu auto|on|off), headed or headless, the flag list.

`off` is software rendering (what a host without a GPU has; SwiftShader still serves WebGPU).
`on` is the known recipe for real WebGPU in headless Chromium: on Linux ANGLE on Vulkan with the
GPU blocklist ignored and no --disable-gpu; on Windows/macOS the platform's default backend
(D3D12/Metal) with the blocklist ignored. Neither ever asks for a software adapter
(--use-webgpu-adapter=swiftshader, --use-vulkan=swiftshader): when Chromium still ends up on one,
the adapter's own words say so (harness.web.adapter). `auto` picks `on` where the host shows a GPU.
Every row records the final flag list, the profile that ran and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.web.eps import EPS

GPU_MODES = ("auto", "on", "off")
BROWSERS = ("chrome", "chromium", "edge")  # what --browser launches (harness.web.driver.CANDIDATES: their binaries)

COMMON_FLAGS = (
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-webgpu",
    # adapter.info gains type (CPU / discrete GPU / integrated GPU), driver and backend: the adapter's truth
    "--enable-webgpu-developer-features",
    # performance.measureUserAgentSpecificMemory() answers at once instead of at the next GC (~15 s here)
    "--enable-blink-features=ForceEagerMeasureMemory",
)
OFF_FLAGS = ("--disable-gpu",)  # right on a host without a GPU, wrong on one with a GPU
LINUX_GPU_FLAGS = (
    "--use-angle=vulkan",
    "--enable-features=Vulkan",
    "--disable-vulkan-surface",
    "--ignore-gpu-blocklist",
)
OTHER_GPU_FLAGS = ("--ignore-gpu-blocklist",)  # Windows/macOS: the default D3D12/Metal backend
# Chromium reads only the last occurrence of these switches, so every value is folded into one.
MERGED_SWITCHES = ("--enable-features", "--disable-features", "--enable-blink-features", "--disable-blink-features")


@dataclass(frozen=True)
class GpuProfile:
    requested: str  # auto | on | off
    name: str  # on | off: the profile the browser is launched with
    reason: str  # why (auto: what on the host decided it)


def host_gpu_evidence(
    platform: str = sys.platform, dri: Path = Path("/dev/dri"), which: Callable[[str], str | None] = shutil.which
) -> str | None:
    """What shows this host has a GPU a browser can use, or None."""
    if not platform.startswith("linux"):
        return f"platform {platform}: the browser's default GPU backend (D3D12/Metal)"
    nodes = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    if nodes:
        return f"render node {nodes[0]}"
    smi = which("nvidia-smi")
    return f"nvidia-smi at {smi}" if smi else None


def gpu_profile(requested: str, evidence: Callable[[], str | None] = host_gpu_evidence) -> GpuProfile:
    if requested in ("on", "off"):
        return GpuProfile(requested, requested, f"--gpu {requested}")
    found = evidence()
    if found:
        return GpuProfile("auto", "on", f"--gpu auto: the host shows a GPU ({found})")
    return GpuProfile("auto", "off", "--gpu auto: no /dev/dri/renderD* node and no nvidia-smi: software rendering")


def merge_switches(flags: Iterable[str]) -> list[str]:
    """Each MERGED_SWITCHES switch once, where it first appeared, with every value in order."""
    merged: list[str] = []
    values: dict[str, list[str]] = {}
    for flag in flags:
        switch, _, value = flag.partition("=")
        if switch not in MERGED_SWITCHES:
            merged.append(flag)
            continue
        if switch not in values:
            values[switch] = []
            merged.append(switch)  # placeholder, filled below
        values[switch] += [v for v in value.split(",") if v and v not in values[switch]]
    return [f"{flag}={','.join(values[flag])}" if flag in values else flag for flag in merged]


def launch_flags(
    eps: Iterable[str], profile: GpuProfile, extra: Iterable[str] = (), platform: str = sys.platform
) -> list[str]:
    """The flags for a browser that runs these EPs: common, the profile's, the EPs', then --browser-arg."""
    flags = list(COMMON_FLAGS)
    if profile.name == "off":
        flags += OFF_FLAGS
    else:
        flags += LINUX_GPU_FLAGS if platform.startswith("linux") else OTHER_GPU_FLAGS
    for ep in eps:
        flags += EPS[ep].flags
    return merge_switches([*flags, *extra])


# --- headed browsers --------------------------------------------------------------------------------


def needs_virtual_display(platform: str = sys.platform) -> bool:
    return platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def headed_problem() -> str | None:
    """Why --headed cannot run here, or None."""
    if needs_virtual_display() and not shutil.which("Xvfb"):
        return "--headed needs a display: DISPLAY is not set and Xvfb is not installed (apt-get install xvfb)"
    return None


class VirtualDisplay:
    """An Xvfb server on a display number it picks itself (what xvfb-run does), for --headed without a
    DISPLAY. It listens on a Unix socket only (-nolisten tcp)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.display: str | None = None

    def start(self) -> str:
        read_end, write_end = os.pipe()
        try:
            command = ["Xvfb", "-displayfd", str(write_end), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"]
            self.process = subprocess.Popen(command, pass_fds=(write_end,), stderr=subprocess.DEVNULL)
        except OSError:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # Xvfb holds its own copy; EOF here once it exits
        with os.fdopen(read_end, "rb") as pipe:
            number = pipe.readline().strip()
        if not number:
            self.stop()
            raise RuntimeError("Xvfb exited without reporting a display number")
        self.display = f":{number.decode()}"
        return self.display

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
