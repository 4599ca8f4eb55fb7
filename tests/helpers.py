"""What the test files share: the device the kernel tests run on, and the relative error the
fused kernels are compared to the reference with.

DEVICE: "cuda" where a CUDA GPU is present (the kernels compiled), else "cpu" (the kernels
through Triton's interpreter, which tests/conftest.py switches on before triton is imported);
SPIKEFUSE_TEST_DEVICE=cpu|cuda overrides. Tests take it as the `device` fixture, module-level
helpers (which build their tensors before any fixture exists) import it from here.
"""
from __future__ import annotations

import contextlib
import os
import threading

import pytest
import torch

DEVICES = ("cpu", "cuda")


def choose_device() -> str:
    requested = os.environ.get("SPIKEFUSE_TEST_DEVICE", "")
    if requested:
        if requested not in DEVICES:
            raise ValueError(f"SPIKEFUSE_TEST_DEVICE={requested!r}: expected one of {list(DEVICES)}")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE = choose_device()


def interpreted() -> bool:
    """Whether Triton's kernels run through its interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| in float64 over the whole tensor (Frobenius norm): the fused kernels
    compute in float32 in another order than the reference, so they agree to a relative
    error, not elementwise."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    """rel_err(actual, expected) <= tol, with the error in the message."""
    err = rel_err(actual, expected)
    assert err <= tol, f"{what + ': ' if what else ''}relative error {err:.3g} > {tol:g}"


@contextlib.contextmanager
def worker_start_method(interpreter: bool = False):
    """The start method for a test's CPU worker processes (gloo ranks): "fork" where a forked
    child can run them (torch is imported already: seconds saved per process), else "spawn".
    On a machine with a CUDA GPU a forked child cannot run autograd once this process has
    (its engine started a thread per GPU, even for CPU tensors), nor CUDA; nor can it switch
    Triton's interpreter on, which Triton decides when a kernel is
    defined; interpreter=True: the children run fused kernels on CPU tensors, so they are
    spawned with TRITON_INTERPRET=1 where this process compiles its kernels. Start the
    processes inside the `with`."""
    spawn = torch.cuda.is_available() or (interpreter and not interpreted())
    before = os.environ.get("TRITON_INTERPRET")
    if spawn and interpreter:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield "spawn" if spawn else "fork"
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def every_value_once(cases, params=None):
    """pytest parameters for `cases` (tuples of option values, e.g. itertools.product of
    resets, surrogates, detach): a case that brings some option a value no earlier case had
    runs by default; the others, combinations of values the default set has each tried, are
    marked `slow` (-m slow takes them). params: what each case is passed as, one argument
    (e.g. its index); by default the case itself, one argument per value."""
    seen, out = set(), []
    for i, case in enumerate(cases):
        new = {(axis, repr(value)) for axis, value in enumerate(case)} - seen
        seen |= new
        values = (case if params is None else (params[i],))
        out.append(pytest.param(*values, marks=() if new else pytest.mark.slow))
    return out


@pytest.fixture
def one_thread():
    """As the CLI does on the CPU: small per-step ops run fastest on one thread (a test file
    makes it autouse: `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeJIT:
    """A stand-in for a @triton.jit kernel under a CachedLaunch: records its compiles
    (warmup, which waits for `release`) and its launches, each as (args, grid, meta); the
    compiled kernel it returns records its own launches in the same list."""

    def __init__(self):
        self.warmups, self.launches, self.release = [], [], threading.Event()

    @staticmethod
    def fn(x_ptr, n, BLOCK):
        pass

    def warmup(self, *args, grid, **meta):
        self.release.wait(10)
        self.warmups.append((args, grid, meta))

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launches.append((args, grid, meta)) or _FakeCompiled(self.launches)


class _FakeCompiled:
    def __init__(self, launches):
        self.launches = launches

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((args, grid, {}))


def fake_cuda_launch(monkeypatch, jit: FakeJIT):
    """A CachedLaunch around `jit` that compiles and launches as on CUDA device 0."""
    from spikefuse.ops import launch
    from spikefuse.ops.launch import CachedLaunch

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(launch, "_triton_driver_ready", lambda: None)
    kernel = CachedLaunch(jit)
    kernel.interpreted = False
    kernel._current_device = lambda: 0
    return kernel
