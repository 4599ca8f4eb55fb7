"""Triton, or, where it is not installed, a stand-in that lets the kernel modules import.

Triton runs our kernels on GPUs (CUDA builds of torch bring it) and, through its interpreter,
in the CPU tests (the test extra installs it). A CPU-only install of the core has no use for
it (a 1 GB package): there every op takes its pure-PyTorch path, and a kernel launched anyway
raises an error that says how to get Triton.

The interpreter switch is Triton's own, TRITON_INTERPRET=1 in the environment before
spikefuse (and so Triton) is imported: the kernels then run through Triton's interpreter, on
CPU tensors, instead of compiled for a GPU. It is read once, here, as `INTERPRETED`; the ops
ask that, never the environment, and spikefuse sets no environment variable. It must be set
before the import because Triton fixes a function's kind when it is decorated, its own
library's functions included (its later setting, triton.knobs.runtime.interpret, leaves those
compiled, and a kernel that calls them then fails). Without it, backend="fused" on a CPU
tensor is refused with a message saying so; the default backend runs the PyTorch paths there.
"""
from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # the stand-in: only what the modules touch at import time
    import logging

    HAVE_TRITON = False
    # torch warns once per triton_op it registers that it found no Triton: here that is expected
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    MISSING = ("this kernel needs Triton, which is not installed: CUDA builds of torch bring it; "
               "on a CPU-only machine `pip install triton` (the pure-PyTorch paths need nothing)")

    class _Kernel:
        """What @triton.jit returns without Triton: the function, unlaunchable."""

        def __init__(self, fn=None, **_options):
            self.fn = fn

        def __getitem__(self, grid):
            raise RuntimeError(MISSING)

    class _Namespace:
        """triton / triton.language / triton.runtime stand-ins: any attribute resolves."""

        def __getattr__(self, name):
            return _Namespace()

    class _Triton(_Namespace):
        @staticmethod
        def jit(fn=None, **options):
            return _Kernel(fn) if fn is not None else (lambda f: _Kernel(f, **options))

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(int(n) - 1, 0).bit_length()

        class runtime:  # noqa: N801  (mirrors triton.runtime)
            JITFunction = _Kernel

    triton = _Triton()
    tl = _Namespace()


def _fix_interpreter_index():
    """Triton's interpreter holds a scalar kernel argument (T, N, ...) as a 1-element array,
    and up to Triton 3.6 turns it into a loop bound (`range(0, T // K)`) with int(array),
    which NumPy 2.4 refuses: every kernel with such a loop raised TypeError('only
    0-dimensional arrays can be converted to Python scalars') (triton-lang/triton#9171).
    Where that interpreter is installed, its index conversion is wrapped to take the one
    element, as later Triton does; others are left alone."""
    try:
        import inspect

        from triton.runtime import interpreter
        patch_tensor = interpreter._patch_lang_tensor
        if "int(self.handle.data))" not in inspect.getsource(patch_tensor):
            return
    except (ImportError, AttributeError, OSError, TypeError):  # no interpreter of that shape
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched


INTERPRETED = HAVE_TRITON and os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on")
if HAVE_TRITON:
    _fix_interpreter_index()

__all__ = ["triton", "tl", "HAVE_TRITON", "INTERPRETED"]
