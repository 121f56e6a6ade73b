"""How much memory this machine has, and a warning for a configuration that would take a large
share of it before a single array is allocated.

The paper's UCI network (1000-500-1 of context dimension 8) holds 5.8 GB for scikit-learn's
digits (64 features, 10 classes): built without a word, it could push a laptop into swap.
``GLN`` and ``GLN.check_config`` warn when ``GLN.estimate_nbytes`` of a configuration exceeds
``WARN_SHARE`` of the memory where the model would live.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Any

# A tenth: the paper's MNIST network (about 0.1 GB) and a service's small models are far below
# it, while a model above it leaves little room for a second copy (to_bytes, a copy or a pickle
# makes one), a few more models and the rest of the program.
WARN_SHARE = 0.1

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def host_memory() -> int:
    """Bytes this process may use: the machine's memory, or its container's (cgroup) limit
    where that is lower. Read once a process: every model built asks (a third of a small
    model's construction went to reading the three files)."""
    return _host_memory()


@functools.cache
def _host_memory() -> int:
    total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < min(total, 1 << 60):  # "max": no limit
            total = int(text)
    return total


def device_memory(device: str, xp: Any) -> int:
    """Bytes of the memory a model on ``device`` (resolved: "cpu" or "cuda") lives in."""
    if device == "cuda":
        return int(xp.cuda.runtime.memGetInfo()[1])
    return host_memory()


def warn_if_large(nbytes: int, total: int, where: str) -> None:
    """A ``UserWarning`` when ``nbytes`` exceeds ``WARN_SHARE`` of
    ``total``, naming both and what shrinks a model."""
    if nbytes > WARN_SHARE * total:
        warnings.warn(
            f"this GLN configuration needs about {nbytes / 2**30:.1f} GiB, more than "
            f"{WARN_SHARE:.0%} of {where} {total / 2**30:.1f} GiB; each neuron holds "
            "2**context_dim weight vectors as wide as its layer's input, so a smaller "
            "context_dim (each step down halves it), fewer neurons in the first layers or "
            "fewer classes shrink it (GLN.estimate_nbytes sizes a configuration)",
            UserWarning,
            stacklevel=4,  # the user's call of GLN(...) or GLN.check_config
        )
