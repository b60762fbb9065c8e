"""What this host offers a model: the memory still available and the physical cores."""
from __future__ import annotations

import os
import sys


def available_memory() -> int | None:
    """Bytes this process could still get: MemAvailable (or free pages), lowered by a cgroup v2
    limit if one applies. None when unknown."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f1, open("/sys/fs/cgroup/memory.current") as f2:
            limit = f1.read().strip()
            if limit != "max":
                avail = min(avail, max(0, int(limit) - int(f2.read().strip())))
    except (OSError, ValueError):
        pass
    return avail


def _sysctl_int(name: bytes) -> int | None:
    """An integer sysctl (macOS), None where it does not exist."""
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        v, n = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        if libc.sysctlbyname(name, ctypes.byref(v), ctypes.byref(n), None, ctypes.c_size_t(0)) == 0:
            return v.value
    except (OSError, AttributeError):
        pass
    return None


def physical_cores() -> int:
    """Physical cores (not hyperthreads) this process may run on: decode is bandwidth/compute bound
    per core, so a second hyperthread on a core mostly adds contention."""
    if sys.platform == "darwin":   # Apple Silicon: the performance cores (efficiency ones slow a step)
        n = _sysctl_int(b"hw.perflevel0.physicalcpu") or _sysctl_int(b"hw.physicalcpu")
        return max(1, n or os.cpu_count() or 1)
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        allowed = set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "core_id") as f1, open(base + "physical_package_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return max(1, len(allowed))
    return max(1, len(cores))
