"""Triton launches with less host work per call.

`kernel[grid](*args, **meta)` through Triton's JIT binds the arguments, computes their
specialization and a cache key string on every call: about 16 us of Python on an H200's
host, as long as some of our kernels take on the GPU (a LIF layer at small batch; a CIFAR
step launches each BatchNorm+LIF layer's kernels 5 times). `cached_launch` wraps
a `@triton.jit` kernel: the first launch of each specialization goes through Triton (which
compiles it and returns the compiled kernel); later launches with the same specialization
call that compiled kernel directly.

The key is at least as fine as Triton's specialization: the values of the
constexpr/launch options, and per argument the tensor dtype and 16-byte alignment, an
integer's value class (== 1, divisible by 16, 32- or 64-bit), a float's type. The current
device is part of it too (Triton loads a compiled kernel on, and launches it to, the
current device). Every launch runs on the device of its first argument (a tensor in all
our kernels): when that is not the current device, it is made current for the launch (a
tensor on cuda:1 would otherwise be launched on cuda:0); when it is, this costs one
comparison. Under the Triton interpreter (CPU tests) every launch goes through Triton unchanged.

Compiles in the background (issue 38: from a cold Triton cache a first epoch was mostly
compiles, one after another, 1.3-5 s each). Triton spends most of a compile in MLIR passes and
ptxas, which run outside the GIL (four compiles in four threads: 5.1 s against 8.2 s one after
another on a 2-core CPU), so variants compile in threads. Beside a busy main thread (training on
with the twins below) a compile thread waits for the GIL each time it returns to Python, up to
the switch interval (5 ms by default) each: a LIF backward compile took 8.4 s beside a Python
loop against 1.0 s alone, and 1.5 s at 0.1 ms (an H200 host's CPU, `benchmarks/compile_time_lif.py
--beside-python`). So while compiles are in flight the interval is SWITCH_INTERVAL_S, restored
after the last (in training, where torch releases the GIL inside each op, a cold first epoch
gained 0.1-0.7 s of 4.8). Under `background_compiles()` on CUDA, on a machine whose cache holds
none of our kernels, the compile itself runs in a forked process (compile_processes.py;
SPIKEFUSE_COMPILE_PROCESSES=0: in the thread) and its thread only prepares the load, then loads
it from Triton's cache: the training thread no longer shares its GIL with the compiles.

- `speculate` compiles a variant likely to be launched soon (a LIF or BN+LIF layer's backward
  and its no-gradient forward, at its first forward; with SPIKEFUSE_SPECULATIVE_COMPILE=1 or
  background compiles on);
- inside `fused_or(fused, fallback)`, while `background_compiles()` is on (Trainer.fit with
  background_compile=True; off by default, since the first steps then depend on compile
  timing), a launch whose variant is not compiled starts its compile in a thread and raises
  `Compiling` unless it finishes within GRACE_S (a disk-cache hit does; once a compile has not,
  or where compile processes run, the cache is cold and launches do not wait): the op then runs
  `fallback`, its pure-PyTorch twin (same spikes, gradients within 1e-5), and training goes on
  while the kernel compiles. `settled` tells CapturedStep when to capture: never while a
  fallback would be captured into the graph.
A launch of a variant in flight outside fused_or waits for it; a compile that fails or guessed
wrong costs only the thread's work (the launch then compiles as before and raises its error).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import os
import sys
import threading

import torch

from . import compile_processes
from .triton_or_stub import INTERPRETED

KERNEL_ON_CPU = ("a fused kernel was given CPU tensors: the kernels run on CUDA tensors, or on the CPU "
                 "through Triton's interpreter with TRITON_INTERPRET=1 set before spikefuse is imported "
                 "(slow: for tests)")
_I32_MIN, _I32_MAX, _I64_MAX = -2**31, 2**31 - 1, 2**63 - 1


def _argument_classes(args):
    """What Triton specializes each runtime argument on (or something finer): a tensor's
    dtype and 16-byte alignment, an integer's == 1, divisible by 16 and bit width, a
    float's type, anything else by value. One comprehension with no calls per argument:
    this runs on every launch."""
    return [(a.dtype, a.data_ptr() & 15 == 0) if isinstance(a, torch.Tensor)
            else (a == 1, a & 15 == 0, _I32_MIN <= a <= _I32_MAX, a <= _I64_MAX) if type(a) is int
            else float if type(a) is float
            else (type(a), a)
            for a in args]


try:  # where Triton keeps its launch hooks (profilers set them)
    from triton import knobs as _knobs
    _HOOKS = _knobs.runtime
except ImportError:  # Triton < 3.4, or none (a CPU-only install: nothing is launched)
    try:
        from triton.compiler.compiler import CompiledKernel as _HOOKS
    except ImportError:
        _HOOKS = None

# The call Triton's CompiledKernel[grid](*args) makes. Where a compiled kernel's class makes
# exactly this call, we make it ourselves, skipping the closure and the device, stream and
# metadata lookups around it (only while no launch hook is set: then we go through Triton).
_RUNNER_CALL = ("self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, "
                "launch_metadata,")


@functools.cache
def _runner_is_mirrored(compiled_class) -> bool:
    try:
        return _RUNNER_CALL in inspect.getsource(compiled_class.__getitem__)
    except (OSError, TypeError, AttributeError):
        return False


def mirrors_triton() -> bool:
    """Whether this Triton's CompiledKernel launches with the call the direct path makes
    (else every cached launch goes through Triton's runner: correct, but slower)."""
    from triton.compiler.compiler import CompiledKernel
    return _runner_is_mirrored(CompiledKernel)


_through_triton = False  # set by through_triton(): every launch takes Triton's own path


@contextlib.contextmanager
def through_triton():
    """Launch through Triton's JIT path while active (benchmarks weigh what caching saves)."""
    global _through_triton
    before, _through_triton = _through_triton, True
    try:
        yield
    finally:
        _through_triton = before


def _unhooked(hook) -> bool:
    """No launch hook: None, or (Triton >= 3.5) an empty HookChain."""
    return hook is None or not getattr(hook, "calls", True)


SWITCH_INTERVAL_S = 1e-4  # the GIL's switch interval while compiles are in flight (see above)
GRACE_S = 0.1  # how long a launch in fused_or waits for its compile: a Triton disk-cache hit takes less


class Compiling(Exception):
    """Raised inside `fused_or` by a launch whose kernel variant is still compiling."""


_background = False  # process-wide: autograd runs the backward in a thread of its own
_local = threading.local()  # .depth: fused_or calls active in this thread
_pending: set = set()  # futures of compiles not finished (wait_for_compiles waits on them)
_deferred = 0  # launches that raised Compiling
_cache_cold = False  # a compile outlasted GRACE_S since background_compiles() began: launches wait no more
_pending_lock = threading.Lock()
_compiling = 0  # compiles in flight (their futures may still be in _pending a moment after)
_interval_before = 0.005  # the switch interval to restore once nothing compiles


def speculation_enabled() -> bool:
    return _background or os.environ.get("SPIKEFUSE_SPECULATIVE_COMPILE", "0") == "1"


@contextlib.contextmanager
def background_compiles(enabled: bool = True):
    """While active, ops inside `fused_or` run their fallback while their kernels compile."""
    global _background, _cache_cold
    before = _background, _cache_cold
    _background, _cache_cold = bool(enabled), False
    if enabled and not INTERPRETED and torch.cuda.is_available():
        # the compile processes first: forked before any compile thread of ours runs (compile_processes.py)
        if not compile_processes.running() and _compiling == 0:
            compile_processes.start(_compile_threads()._max_workers)
        # from a cold cache, no compile is a disk-cache hit: the first launch need not wait GRACE_S for it
        _cache_cold = compile_processes.began_cold()
        _compile_threads().submit(_triton_driver_ready)  # Triton's once-per-process set-up (0.4-0.9 s) starts
    try:                                                 # now, not at the first compile
        yield
    finally:
        _background, _cache_cold = before
        if compile_processes.running() and _compiling == 0:  # else the next fit's end (or the exit) ends them
            compile_processes.stop()


def fused_or(fused, fallback):
    """fused(), or fallback() if a kernel it launches is still compiling in the background (only
    while background_compiles() is on; fused() must have changed nothing before its launches)."""
    if torch.compiler.is_dynamo_compiling() or not _background:
        return fused()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        return fused()
    except Compiling:
        return fallback()
    finally:
        _local.depth -= 1


_stand_ins_captured = False  # process-wide, as _background: set while CapturedStep captures a provisional graph


@contextlib.contextmanager
def stand_ins_captured(enabled: bool = True):
    """While active (and capturing), a launch in fused_or whose kernel is compiling defers to its stand-in,
    which the graph then records, as outside a capture (else a capture waits for every compile)."""
    global _stand_ins_captured
    before, _stand_ins_captured = _stand_ins_captured, bool(enabled)
    try:
        yield
    finally:
        _stand_ins_captured = before


_recorded: list | None = None  # set by recording_deferrals(): the compiles launches deferred to


@contextlib.contextmanager
def recording_deferrals():
    """While active, the futures of the compiles that launches deferred to (raised Compiling for) are
    collected in the list it yields: a graph captured with stand-ins can be captured again once those
    are done, before every other compile is (CapturedStep)."""
    global _recorded
    before, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = before


def compiles_in_flight() -> int:
    return _compiling


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until no compile is in flight (or `timeout` seconds pass); True if none is."""
    with _pending_lock:
        pending = list(_pending)
    concurrent.futures.wait(pending, timeout=timeout)
    return _compiling == 0


def cold_compiles_in_flight() -> bool:
    """Under background compiles: compiles in flight, and one of them outlasted GRACE_S in this run
    (the cache is cold): ops with quick variants (ops/lif.py) run those meanwhile."""
    return _background and _cache_cold and _compiling > 0


def compiles_in_processes() -> bool:
    """Whether compiles run in compile processes: more of them at once then take nothing from the
    training thread (in threads, each shares its GIL)."""
    return compile_processes.running()


def deferrals() -> int:
    """How many launches have raised Compiling so far (a step whose count moved ran a fallback)."""
    return _deferred


def settled(deferrals_before: int) -> bool:
    """Nothing compiling, and no launch deferred since deferrals() was `deferrals_before`."""
    return _compiling == 0 and _deferred == deferrals_before


_driver_lock = threading.Lock()


def _triton_driver_ready() -> None:
    """What Triton does once per process, done once and not in every compile thread at the same
    time: set up its driver (the first use builds a C helper module) and hash its own sources and
    library into the key of every cache entry (0.4 s; its memo has no lock)."""
    from triton.runtime import driver
    with _driver_lock:
        driver.active.get_current_target()
        compile_processes.hash_triton()


_kernel_loads_lock = threading.Lock()


def _serialize_kernel_loads() -> None:
    """One kernel's handles loaded at a time, in every thread (Triton's own launches included).

    Triton builds each kernel signature's launcher as a C extension module, all named
    `__triton_launcher`. When CPython loads such a module again from a path it has loaded
    before (a second variant of a kernel: same signature, same launcher file), it copies the
    saved module dict into whatever module sys.modules holds under that name, and returns
    that one. So two threads loading launchers at once can read each other's `launch`: a
    warm run's BN+LIF backward got its forward's ("function takes exactly 35 arguments (39
    given)", benchmarks/results/runs-2026-11-27-s17/). Loading takes milliseconds; compiles,
    the long part, still run in parallel."""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:  # no Triton: nothing is compiled or loaded
        return
    unlocked = CompiledKernel._init_handles
    if getattr(unlocked, "serialized_by_spikefuse", False):
        return

    @functools.wraps(unlocked)
    def init_handles(self):
        if self.module is not None:  # loaded: Triton returns at once (this runs on every launch through it)
            return None
        with _kernel_loads_lock:
            return unlocked(self)
    init_handles.serialized_by_spikefuse = True
    CompiledKernel._init_handles = init_handles


@functools.cache
def _compile_threads() -> concurrent.futures.ThreadPoolExecutor:
    _serialize_kernel_loads()  # before the first thread exists
    return concurrent.futures.ThreadPoolExecutor(max(1, min(8, usable_cpus() - 1)),
                                                 thread_name_prefix="spikefuse-compile")


def usable_cpus() -> int:
    """The CPUs this process may run on (a Slurm job's or taskset's share), not the host's count: as
    many compile processes as the host has cores would crowd a job given a few of them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 2


def _submit(compile_fn, *args) -> concurrent.futures.Future:
    _gil_for_compiles(+1)
    try:
        future = _compile_threads().submit(_compile_counted, compile_fn, args)
    except BaseException:  # the pool shut down (the interpreter exits)
        _gil_for_compiles(-1)
        raise
    with _pending_lock:
        _pending.add(future)
    future.add_done_callback(_discard)
    return future


def _compile_counted(compile_fn, args):
    try:
        return compile_fn(*args)
    finally:  # before the future completes: who waits for it finds the interval restored
        _gil_for_compiles(-1)


def _discard(future) -> None:
    with _pending_lock:
        _pending.discard(future)


def _gil_for_compiles(change: int) -> None:
    """Count compiles in flight; SWITCH_INTERVAL_S while any runs, the interval before after."""
    global _compiling, _interval_before
    with _pending_lock:
        if _compiling == 0:
            _interval_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_interval_before, SWITCH_INTERVAL_S))
        _compiling += change
        if _compiling == 0:
            sys.setswitchinterval(_interval_before)


class CachedLaunch:
    """kernel[grid](*args, **meta), with Triton's per-call argument binding skipped after
    the first launch of each specialization. Positional arguments are the kernel's runtime
    arguments; constexprs and launch options (num_warps, ...) come as keywords."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.interpreted = INTERPRETED
        self._compiled = {}
        self._in_flight = {}  # key -> Future of a speculative compile
        self.misses = 0  # launches that went through Triton: a new variant (every launch when interpreted)
        params = inspect.signature(kernel.fn).parameters
        self._names = list(params)
        self._defaults = {name: p.default for name, p in params.items() if p.default is not p.empty}
        # integers Triton does not specialize on (do_not_specialize): keyed by bit width only, so that
        # a new value class (a last, smaller batch) takes the compiled variant instead of deferring
        self._unspecialized = [p.num for p in getattr(kernel, "params", ()) if getattr(p, "do_not_specialize", False)]
        # Triton compiles for, and launches on, the current device and its current stream
        cuda = torch.cuda.is_available()
        self._current_device = torch.cuda.current_device if cuda else (lambda: -1)
        self._current_stream = torch._C._cuda_getCurrentRawStream if cuda else (lambda device: 0)
        self._capturing = torch.cuda.is_current_stream_capturing if cuda else (lambda: False)

    def __getitem__(self, grid):
        return lambda *args, **meta: self._launch(grid, args, meta)

    def _through_jit(self, grid, args, meta, target):
        try:
            return self.kernel[grid](*args, **meta)
        except (RuntimeError, ValueError) as e:  # CPU tensors, compiled kernels: Triton says "0 active
            # drivers" where there is no GPU, "Pointer argument ... cannot be accessed" where there is
            if target < 0 and isinstance(args[0], torch.Tensor):
                raise RuntimeError(KERNEL_ON_CPU) from e
            raise

    def speculate(self, device: int, grid, args, meta) -> None:
        """Compile, in a background thread, the variant that launching `args` with `meta` on CUDA
        device `device` would need, unless it is compiled or in flight. args may be meta tensors:
        a variant depends on the tensors' dtypes and alignment only (a meta tensor's address is 0)."""
        key = self._key(device, args, meta)
        if self.interpreted or key in self._compiled or key in self._in_flight:
            return
        self._start_compile(key, device, grid, args, meta)

    def _key(self, device, args, meta):
        classes = _argument_classes(args)
        for i in self._unspecialized:
            if type(args[i]) is int:
                classes[i] = (int, _I32_MIN <= args[i] <= _I32_MAX)
        return (device, *meta.items(), *classes)

    def _start_compile(self, key, device, grid, args, meta) -> concurrent.futures.Future:
        # a dtype stands for a 16-byte aligned tensor of it (Triton's MockTensor); no tensor is kept
        signature = [a.dtype if isinstance(a, torch.Tensor) else a for a in args]
        future = self._in_flight[key] = _submit(self._compile_only, device, grid, signature, meta)
        return future

    def _compile_only(self, device, grid, signature, meta):
        torch.cuda.set_device(device)  # Triton compiles for (or loads on) this thread's current device
        # with compile processes (the cache is cold) the compile starts in a child at once; this thread
        # prepares the load meanwhile, then loads the kernel from the cache (else compiles it here)
        compile_processes.compile_in_child(self.kernel, device, signature, meta, self._prepare_load)
        compiled = self.kernel.warmup(*signature, grid=grid, **meta)
        # Load it and build its launcher here too: Triton 3.6 builds each kernel signature's C launcher
        # with the system compiler (0.2-0.3 s) at the first launch, which would run on the training thread
        # (a cold CIFAR-medium step spent 2.3 s there, benchmarks/results/runs-2026-11-27-s15/).
        init_handles = getattr(compiled, "_init_handles", None)
        if init_handles is not None:
            init_handles()
        compile_processes.mark_cache_warm()  # the next process here need not fork compile processes

    def _prepare_load(self) -> None:
        """This process's share of loading a compiled kernel: Triton's set-up, and the kernel's source
        hash (its source and every function it calls; once per kernel, under Triton's lock)."""
        _triton_driver_ready()
        getattr(self.kernel, "cache_key", None)

    def _defer(self, key, device, grid, args, meta) -> None:
        """Inside fused_or: raise Compiling unless this variant's compile (started now, if need
        be, and given GRACE_S) has finished."""
        global _deferred, _cache_cold
        future = self._in_flight.get(key)
        if future is None:
            future = self._start_compile(key, device, grid, args, meta)
            if not _cache_cold:  # once a compile has outlasted the grace, the cache is cold: wait no more
                concurrent.futures.wait([future], timeout=GRACE_S)
                _cache_cold = not future.done()
        if not future.done():
            _deferred += 1
            if _recorded is not None:
                _recorded.append(future)
            raise Compiling(key)

    def _launch(self, grid, args, meta):
        if self.interpreted:
            self.misses += 1
            return self.kernel[grid](*args, **meta)
        device = self._current_device()
        target = args[0].get_device() if isinstance(args[0], torch.Tensor) else -1  # -1: CPU
        if target != device and target >= 0:  # Triton launches on the current device: make it x's
            with torch.cuda.device(target):
                return self._launch(grid, args, meta)
        if _through_triton:
            return self._through_jit(grid, args, meta, target)
        key = self._key(device, args, meta)
        entry = self._compiled.get(key)
        if entry is None:  # Triton compiles (or finds) it and launches it
            # a graph keeps no stand-in, but a provisional one (stand_ins_captured)
            if _background and getattr(_local, "depth", 0) and (_stand_ins_captured or not self._capturing()):
                self._defer(key, device, grid, args, meta)
            self.misses += 1
            speculated = self._in_flight.pop(key, None)
            if speculated is not None:
                speculated.exception()  # waits; a failed speculation is compiled below as before
            tail = tuple(meta[name] if name in meta else self._defaults[name]
                         for name in self._names[len(args):])
            compiled = self._through_jit(grid, args, meta, target)
            self._compiled[key] = (compiled, tail, _runner_is_mirrored(type(compiled)))
            compile_processes.mark_cache_warm()
            return
        compiled, tail, direct = entry
        grid = (*grid, 1, 1)[:3]
        if direct and _unhooked(_HOOKS.launch_enter_hook) and _unhooked(_HOOKS.launch_exit_hook):
            compiled.run(*grid, self._current_stream(device), compiled.function,
                         compiled.packed_metadata, None, None, None, *args, *tail)
        else:
            compiled[grid](*args, *tail)


def cached_launch(kernel) -> CachedLaunch:
    return CachedLaunch(kernel)
