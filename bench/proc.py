"""What Linux's /proc says about a process's memory, for the benchmarks that measure peaks."""

from __future__ import annotations

from pathlib import Path


def status_kib(key: str, pid: int | str = "self") -> int:
    """A `/proc/<pid>/status` figure in KiB (`VmHWM`, `VmRSS`, ...); 0 once the process has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_mib() -> float:
    """This process's peak resident memory so far (VmHWM), in MiB."""
    return status_kib("VmHWM") / 1024
