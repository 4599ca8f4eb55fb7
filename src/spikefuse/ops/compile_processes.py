"""Triton compiles in forked processes, so that they do not share the training thread's GIL.

Background compiles (launch.py) ran in threads of the training process. Triton returns to Python
between its MLIR passes, so each compile thread took the interpreter lock hundreds of times, and
the training thread waited for it at every torch op: steps of 4-5 ms took 20-70 ms while 2-4
kernels compiled (benchmarks/results/runs-2026-11-27-s15/). Here the compile itself (Triton's
passes, ptxas, and the gcc build of the kernel's C launcher) runs in a process forked from the
trainer, which writes it to Triton's cache directory; the compile thread, which meanwhile only
prepares the load (Triton's set-up, the kernel's source hash), then loads it from that cache.

Why fork, not spawn: a fresh interpreter imports torch, Triton and spikefuse first (5-25 s on a
busy GPU host), longer than a whole cold first epoch. A forked child has them already and finds the
kernel by its module and name. It must not touch CUDA (a forked CUDA context is unusable, torch
refuses it): Triton needs the device only for its target and current device and stream, which the
child answers from values the parent read before forking. When background compiles begin (`start`),
the calling thread forks one process, before any compile thread of ours runs, so no thread of ours
holds a lock (LLVM's, the driver set-up's) that a child would inherit held. That process sets Triton
up and forks the workers itself (zygote_pool.py): forking 8 workers from the trainer took 0.13 s of
its thread at a cold fit's start. They end (`stop`) at the end of the first fit that ends with nothing
compiling: a forked child keeps the pages the trainer writes later. They are forked once per process:
a later fit (a run that calls fit once per epoch) reuses them while they run, or compiles in threads
(new shapes only, by then).

Where kernels of ours were compiled into Triton's cache before (this machine trained before: a
marker file we leave there, `spikefuse-kernels`), no processes are forked at all: the kernels load
from it, and forking would only cost its 0.1-0.2 s; the few new variants (a new shape) compile in
threads. So while the processes run the cache is cold, and a compile goes to a child at once: the
compile thread does its own share meanwhile (Triton's set-up, the kernel's source hash), not
before. (It used to probe the cache for the kernel first: in a timeline of the IPU SHD net's cold
first epoch the first compiles reached the children 0.5-0.7 s after they were asked for;
benchmarks/results/runs-2026-11-27-s17/timelines-0bf2dac/. Without it, the IPU net's cold time to
target in `bench runs` went from 2.0 to 1.3 s, with d0602b1's re-captures: runs-2026-11-27-s18/.)

A compile the children cannot do (a kernel not reachable by module and name, arguments that do not
pickle, a child that died) is compiled in the thread as before, where Triton raises its own error.

On by default; SPIKEFUSE_COMPILE_PROCESSES=0 keeps every compile in threads. Measured with `spikefuse
bench runs` on 4x H100 (benchmarks/results/runs-2026-11-27-s17/): with provisional graphs
(capture.py), a cold run reached its target in 1.2 s against 2.6 s on shd and 1.7 against 2.6-2.8 s
on the IPU SHD net. Their cost: the fork of 8 workers from the training thread took 0.13 s of a cold
IPU fit, and its first step came 0.25 s later than with compiles in threads (runs-2026-11-27-s18/;
since then one fork from that thread; the rest is the copy-on-write of the pages the trainer writes
while the children share them, not yet measured on a GPU).
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import threading

import torch

from .zygote_pool import ZygotePool

_pool: ZygotePool | None = None
_forked = False  # forked, or decided not to: once per process (see the module's docstring)
_began_cold = False  # ... and forked: Triton's cache held none of our kernels when this process began
_marked = False  # this process has tried to leave the marker in Triton's cache directory
_created = False  # ... and created it: then the cache was not warm when this process began
MARKER = "spikefuse-kernels"  # a file of ours in Triton's cache directory: our kernels were compiled into it
_lock = threading.Lock()
_child_device = {"index": 0}  # in a child: the device Triton is told is current
last_failure = ""  # why the children last left a compile to the thread (benchmarks print it)


def enabled() -> bool:
    return (os.environ.get("SPIKEFUSE_COMPILE_PROCESSES", "1") != "0" and sys.platform == "linux"
            and "fork" in multiprocessing.get_all_start_methods())


def start(workers: int) -> bool:
    """Fork `workers` compile processes now, unless they run already; False if compiles stay in threads
    (turned off, decided before in this process, or our kernels were compiled into Triton's cache
    before). Call from the thread that trains, before compile threads start (see the module's
    docstring)."""
    global _pool, _forked, _began_cold
    with _lock:
        if _pool is not None:
            return True
        if _forked or not enabled():
            return False
        _forked = True
        if cache_is_warm():
            return False
        targets = {d: torch.cuda.get_device_capability(d) for d in range(torch.cuda.device_count())}
        try:  # one fork from this thread; that process sets Triton up and forks the workers (zygote_pool.py)
            _pool = ZygotePool(workers, _child_setup, (os.getpid(), targets), _end_with)
        except OSError:  # no process to be had (a process limit, no memory): compiles stay in threads
            return False
        _began_cold = True
        return True


def began_cold() -> bool:
    """Whether this process found Triton's cache without our kernels and forked compile processes:
    then a variant it has not compiled yet is not in the cache either (no disk-cache hit to wait for)."""
    return _began_cold


def cache_dir() -> str:
    """Triton's cache directory in this process (TRITON_CACHE_DIR, or its default)."""
    try:
        from triton import knobs
        return knobs.cache.dir
    except (ImportError, AttributeError):  # Triton < 3.4
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def cache_is_warm() -> bool:
    """Whether kernels of ours were compiled into Triton's cache directory before: the marker file
    there. One stat, not a scan of the cache (a cache torch.compile filled can hold tens of thousands
    of entries: listing 10 000 took 0.3-1.3 s on a 2-core machine). A cache emptied by deleting its
    directory loses the marker too; one pruned entry by entry keeps it (compiles then run in threads)."""
    return not _created and os.path.exists(os.path.join(cache_dir(), MARKER))


def mark_cache_warm() -> None:
    """Leave the marker once a kernel of ours is compiled into the cache (once per process; created
    exclusively, so no file is ever overwritten)."""
    global _marked, _created
    if _marked or not torch.cuda.is_available():  # (CPU tests fake their launches: nothing compiled)
        return
    _marked = True
    try:
        with open(os.path.join(cache_dir(), MARKER), "x") as marker:
            marker.write("spikefuse's Triton kernels were compiled into this cache directory\n")
        _created = True  # (a kernel compiled before the first fit: this process still began cold)
    except OSError:  # there already (FileExistsError), or the cache is elsewhere or read-only: no marker
        pass


def stop() -> None:
    """End the compile processes (a compile still running in one is compiled in its thread instead)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown()


def running() -> bool:
    return _pool is not None


def compile_in_child(kernel, device: int, signature: list, meta: dict, meanwhile=None) -> bool:
    """Compile `kernel` (a @triton.jit function) for `signature` and `meta` in a compile process, into
    Triton's cache, running `meanwhile()` (the caller's own share of the work) while it compiles; then
    wait for it. False where the children cannot do it (then compile it here); `meanwhile` runs either way."""
    global last_failure
    pool, fn, future = _pool, getattr(kernel, "fn", None), None
    if pool is not None and fn is not None:
        try:
            future = pool.submit(_compile, fn.__module__, fn.__qualname__, device, signature, meta)
        except Exception as e:  # unpicklable arguments, a broken pool: the thread compiles
            last_failure = f"{fn.__module__}.{fn.__qualname__}: {type(e).__name__}: {e}"
    if meanwhile is not None:
        meanwhile()
    if future is None:
        return False
    try:
        if future.result():
            return True
        last_failure = f"{fn.__module__}.{fn.__qualname__}: not found by that name in a child"
    except Exception as e:  # a failed compile, a child that died: the thread compiles (and raises Triton's error)
        last_failure = f"{fn.__module__}.{fn.__qualname__}: {type(e).__name__}: {e}"
    return False


# ---- in the child ----

def _end_with(parent: int) -> None:
    """End with the parent (the trainer, or for a worker the process that forked it)."""
    try:  # Linux: SIGTERM when the parent dies, even by SIGKILL (else a child waits on its queue for ever);
        # strictly, when the thread that forked it ends: then compiles fall back to threads
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the trainer; it ends us


def _child_setup(parent: int, targets: dict) -> None:
    """In the process that forks the workers (they inherit it): answer Triton's device questions
    without CUDA, hash Triton, and end with the parent."""
    _end_with(parent)
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    try:
        active = driver.active  # set up in the parent already, or here (a C helper module, no CUDA call)
    except RuntimeError:  # no GPU driver (CPU tests of these processes): Triton fails in the compile instead
        return
    current = _child_device
    active.get_current_device = lambda: current["index"]
    active.set_current_device = lambda index: current.update(index=index)
    active.get_current_stream = lambda index=None: 0
    active.get_device_capability = lambda index=None: targets[current["index"] if index is None else index]
    active.get_current_target = lambda: GPUTarget("cuda", _arch(targets[current["index"]]), 32)
    hash_triton()  # once, before the workers are forked, not in each one's first compile


def hash_triton() -> None:
    """Triton hashes its own sources and library into the key of every cache entry, once per process
    (0.4 s; where the function lives depends on Triton's version)."""
    import triton.compiler.compiler  # noqa: F401  (imports triton.runtime.cache too)
    for module in ("triton.runtime.cache", "triton.compiler.compiler"):
        triton_key = getattr(sys.modules.get(module), "triton_key", None)
        if triton_key is not None:
            triton_key()
            return


def _arch(capability) -> int:
    return capability[0] * 10 + capability[1]


def jit_function(module: str, name: str):
    """The @triton.jit function named `name` in `module` (where a CachedLaunch wraps it, the wrapped
    one), or None."""
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    found = getattr(found, "kernel", found)  # a CachedLaunch holds the kernel
    return found if callable(getattr(found, "warmup", None)) else None


def _compile(module: str, name: str, device: int, signature: list, meta: dict) -> bool:
    kernel = jit_function(module, name)
    if kernel is None:
        return False
    _child_device["index"] = device
    compiled = kernel.warmup(*signature, grid=(1,), **meta)
    try:  # its C launcher too: Triton 3.6 builds one per signature with gcc and caches it beside the kernel
        from triton.runtime import driver
        driver.active.launcher_cls(compiled.src, compiled.metadata)
    except Exception:  # (another Triton: the parent builds it when it loads the kernel)
        pass
    return True
