"""The cached Triton launcher: which launches reuse a compiled kernel, and that a pointer
Triton would specialize differently (alignment) still gets its own compile."""
import inspect
from types import SimpleNamespace

import pytest
import torch

import spikefuse.functional as F
from spikefuse import reference
from spikefuse.ops.launch import CachedLaunch
from helpers import DEVICE


class FakeJIT:
    """Stands in for a @triton.jit kernel: records Triton-path launches and returns a
    compiled kernel that records direct launches."""

    def __init__(self):
        def fn(a_ptr, n, scale, BLOCK, FLAG=3):
            pass
        self.fn = fn
        self.jit_launches, self.direct_launches = [], []
        self.make_compiled = FakeCompiled

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.jit_launches.append((grid, args, meta))
            return self.make_compiled(self.direct_launches)
        return launch


class FakeCompiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append((grid, args))


def fake_launcher():
    launcher = CachedLaunch(FakeJIT())
    launcher.interpreted = False
    return launcher


def test_second_launch_skips_the_jit_and_passes_every_argument():
    launcher = fake_launcher()
    a = torch.zeros(64)
    launcher[(4,)](a, 100, 0.5, BLOCK=32, num_warps=1)
    launcher[(5,)](a, 132, 0.25, BLOCK=32, num_warps=1)  # same classes: 100, 132 not multiples of 16
    jit, direct = launcher.kernel.jit_launches, launcher.kernel.direct_launches
    assert len(jit) == 1 and len(direct) == 1
    grid, args = direct[0]
    assert grid == (5, 1, 1)
    assert args == (a, 132, 0.25, 32, 3)  # constexprs in signature order, defaults filled in


@pytest.mark.parametrize("change", ["alignment", "dtype", "int one", "int multiple of 16",
                                    "constexpr", "launch option"])
def test_a_different_specialization_compiles_again(change):
    launcher = fake_launcher()
    base = torch.zeros(64)
    args, meta = [base, 7, 0.5], {"BLOCK": 32, "num_warps": 1}
    launcher[(1,)](*args, **meta)
    if change == "alignment":
        args[0] = base[1:]  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        args[0] = base.to(torch.bfloat16)
    elif change == "int one":
        args[1] = 1
    elif change == "int multiple of 16":
        args[1] = 32
    elif change == "constexpr":
        meta["BLOCK"] = 64
    else:
        meta["num_warps"] = 2
    launcher[(1,)](*args, **meta)
    assert len(launcher.kernel.jit_launches) == 2 and not launcher.kernel.direct_launches


def test_an_integer_triton_does_not_specialize_on_keeps_its_compiled_kernel():
    # spike_pack's n_bytes (do_not_specialize): a last, smaller batch reuses the compiled variant
    jit = FakeJIT()
    jit.params = [SimpleNamespace(num=i, do_not_specialize=i == 1) for i in range(3)]
    launcher = CachedLaunch(jit)
    launcher.interpreted = False
    a = torch.zeros(64)
    for n in (32, 7, 1):
        launcher[(1,)](a, n, 0.5, BLOCK=32)
    assert len(jit.jit_launches) == 1 and len(jit.direct_launches) == 2
    launcher[(1,)](a, 2**40, 0.5, BLOCK=32)  # a 64-bit integer is another signature
    assert len(jit.jit_launches) == 2


class FakeTritonCompiled:
    """Shaped like Triton's CompiledKernel: [grid] gives a runner that makes the call
    launch.py mirrors; `run` records what it is called with."""
    function, packed_metadata = "function handle", "packed metadata"

    def __init__(self, log):
        self.log = log

    def run(self, *call):
        self.log.append(call)

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            stream = 7  # the fake current stream
            launch_metadata = None
            self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, launch_metadata,
                     None, None, *args)
        return runner


def mirrored_launcher(monkeypatch, hook=None):
    from spikefuse.ops import launch
    monkeypatch.setattr(launch, "_HOOKS", SimpleNamespace(launch_enter_hook=hook, launch_exit_hook=None))
    jit = FakeJIT()
    jit.make_compiled = FakeTritonCompiled
    launcher = CachedLaunch(jit)
    launcher.interpreted = False
    launcher._current_stream = lambda device: 8  # the runner says 7: tells the paths apart
    return launcher


class EmptyHookChain:  # Triton >= 3.5 keeps its hooks in chains, empty when unset
    calls = []


@pytest.mark.parametrize("hook", [None, EmptyHookChain(), print])
def test_direct_call_is_the_runners_call(monkeypatch, hook):
    """Without a launch hook the second launch calls compiled.run itself, with exactly the
    arguments Triton's runner would pass; with a hook set it goes through the runner."""
    launcher = mirrored_launcher(monkeypatch, hook)
    a = torch.zeros(64)
    launcher[(4,)](a, 100, 0.5, BLOCK=32, num_warps=1)
    launcher[(5, 2)](a, 132, 0.25, BLOCK=32, num_warps=1)
    (direct,) = launcher.kernel.direct_launches
    compiled = next(iter(launcher._compiled.values()))[0]
    runner_log = []
    FakeTritonCompiled(runner_log)[(5, 2, 1)](a, 132, 0.25, 32, 3)
    assert compiled.log is launcher.kernel.direct_launches
    assert direct[3] == (7 if hook is print else 8)  # through the runner only while a hook is set
    assert direct[:3] + direct[4:] == runner_log[0][:3] + runner_log[0][4:] == (
        5, 2, 1, "function handle", "packed metadata", None, None, None, a, 132, 0.25, 32, 3)


def test_interpreter_always_goes_through_triton():
    launcher = CachedLaunch(FakeJIT())
    launcher.interpreted = True
    a = torch.zeros(8)
    for _ in range(3):
        launcher[(1,)](a, 3, 1.0, BLOCK=8)
    assert len(launcher.kernel.jit_launches) == 3


def test_real_kernels_signatures_are_read():
    from spikefuse.ops import lif
    names = list(inspect.signature(lif._lif_forward_kernel.kernel.fn).parameters)
    assert lif._lif_forward_kernel._names == names and names[-1] == "EVEN_N"


def test_lif_on_misaligned_input_after_aligned():
    """On a GPU the second call would reuse the aligned compile if alignment were not in
    the key; the offset view's pointer is 4 bytes past a 16-byte boundary."""
    T, N = 5, 96
    base = torch.randn(T * N + 1, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    aligned, offset = base[:-1].view(T, 1, N), base[1:].view(T, 1, N)
    for x in (aligned, offset, aligned):
        x = x.detach().requires_grad_(True)
        ours = F.lif(x, backend="fused")
        ref = reference.lif(x.detach().cpu(), 0.5, 1.0, "hard", 0.0, False, "rectangular", 1.0, None, False)
        assert torch.equal(ours.cpu(), ref)


def test_direct_launch_still_mirrors_this_triton():
    """The direct path copies the call Triton's CompiledKernel makes. On a GPU a change of
    that call fails here, naming the version; the CPU CI, whose Triton is newer than the GPU
    machines', only warns (its kernels run through the interpreter, never the direct path)."""
    import triton

    from spikefuse.ops.launch import mirrors_triton
    message = (f"Triton {triton.__version__}: CompiledKernel.__getitem__ no longer makes the call "
               "spikefuse/ops/launch.py mirrors; cached launches fall back to Triton's runner")
    if DEVICE == "cuda":
        assert mirrors_triton(), message
        x = torch.randn(7, 3, 33, device="cuda", requires_grad=True)
        F.lif(x, backend="fused").sum().backward()
        from spikefuse.ops import lif
        for launcher in (lif._lif_forward_kernel, lif._lif_backward_kernel):
            assert launcher._compiled and all(direct for _, _, direct in launcher._compiled.values()), message
    elif not mirrors_triton():
        import warnings
        warnings.warn(message)


def test_through_triton_takes_the_jit_path_while_active():
    from spikefuse.ops.launch import through_triton
    launcher = fake_launcher()
    a = torch.zeros(64)
    launcher[(1,)](a, 100, 0.5, BLOCK=32)
    with through_triton():
        launcher[(1,)](a, 100, 0.5, BLOCK=32)
    launcher[(1,)](a, 100, 0.5, BLOCK=32)
    assert len(launcher.kernel.jit_launches) == 2 and len(launcher.kernel.direct_launches) == 1
