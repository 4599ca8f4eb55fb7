"""Memory checks before large allocations: refuse with a message naming the size and what
to lower, instead of an allocator error (or minutes of swapping) half-way through.

The checks are estimates, made once per data set or per framing plan from sizes the host
already knows: never a device sync. Small requests (below CHECK_ABOVE) skip the check.
"""
from __future__ import annotations

import os

import torch

CHECK_ABOVE = 2**30  # bytes; below this an allocation is not worth a system call


def available_bytes(device, *, free: bool = True) -> int | None:
    """Memory free for new tensors on `device` (host RAM for the CPU), or None if unknown.
    free=False on a GPU: its total memory, from the cached device properties (no driver call;
    for checks made per batch group, which only need to catch what could never fit)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not free:
            return int(torch.cuda.get_device_properties(device).total_memory)
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return int(free_bytes)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:  # MemAvailable counts reclaimable page cache, as it should
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 1000 or unit == "PB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    return f"{nbytes:.3g} EB"  # pragma: no cover


def require(nbytes: int, device, what: str, hint: str, *, free: bool = True) -> None:
    """Raise ValueError ("`what` needs about X of memory on DEVICE, Y is available; `hint`")
    when `nbytes` is more than `device` has free (free=False: more than a GPU has at all)."""
    if nbytes <= CHECK_ABOVE:
        return
    have = available_bytes(device, free=free)
    if have is not None and nbytes > have:
        where = "host memory" if torch.device(device).type == "cpu" else f"memory on {device}"
        raise ValueError(f"{what} needs about {human(nbytes)} of {where}, {human(have)} is available; {hint}")
