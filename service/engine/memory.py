"""How much memory the models may hold by default: a share of what this process may use.

On the CPU that is the machine's memory, or its container's (cgroup) limit where lower; on the
GPU the device's memory. A fixed default (8 GiB once) let a small machine admit models it
could not hold, and a large one refuse models it could.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

CPU_SHARE = 0.5  # the rest for the process itself, requests in flight, snapshots' copies
GPU_SHARE = 0.8  # the rest for CuPy's pools, the chunks in flight and the CUDA context

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_CGROUP_USAGE = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")


def _meminfo(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _first_number(paths: tuple[str, ...]) -> int | None:
    for path in paths:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's "no limit" sentinel
            return int(text)
    return None


def host_memory() -> tuple[int, int]:
    """(bytes this process may use, bytes free now): the machine's, or its cgroup's where
    that is lower."""
    total = _meminfo("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free = _meminfo("MemAvailable") or total
    limit = _first_number(_CGROUP_LIMITS)
    if limit is not None and limit < total:
        used = _first_number(_CGROUP_USAGE) or 0
        total, free = limit, min(free, max(0, limit - used))
    return total, free


def device_memory(xp: ModuleType) -> tuple[int, int]:
    """(bytes, bytes free now) of the current GPU (``xp`` is CuPy)."""
    free, total = xp.cuda.runtime.memGetInfo()
    return int(total), int(free)


def memory(device: str) -> tuple[int, int]:
    """(bytes, bytes free now) of where a model of ``device`` ("cpu" or "cuda") lives."""
    if device == "cuda":
        import cupy  # noqa: PLC0415 - only a GPU server asks

        return device_memory(cupy)
    return host_memory()


def default_budget(device: str) -> tuple[int, str]:
    """The bytes all models may hold by default on ``device``, and where that comes from."""
    total, _ = memory(device)
    share = GPU_SHARE if device == "cuda" else CPU_SHARE
    where = "the GPU's" if device == "cuda" else "this process's"
    return int(total * share), f"{share:.0%} of {where} {total / 2**30:.1f} GiB"
