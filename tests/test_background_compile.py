"""Background compiles (ops/launch.py; Trainer.fit's background_compile): inside fused_or, a
launch whose kernel is still compiling raises Compiling and the op runs its torch twin. What
the CPU can show: the deferral logic on a stand-in kernel, and every op's stand-in (LIF forward
and backward, BN+LIF statistics, forward and backward, bit packing, the sparse Linear backward)
giving the fused op's spikes, gradients, running statistics and counts while chosen kernels are
held "compiling". The real compile threads run on a GPU (the gpu test below;
benchmarks/compile_time_lif.py --cold)."""
import concurrent.futures
import copy
import sys
import threading

import pytest
import torch

import spikefuse.functional as F
from spikefuse.capture import CapturedStep
from spikefuse.nn import BNLIF
from spikefuse.nn.spiking_layers import SpikingLinear
from spikefuse.ops import bn_lif as bn_lif_ops, kernel_base, launch, lif as lif_ops, sparse_linear, spike_index, spike_pack
from spikefuse.ops.launch import (CachedLaunch, Compiling, background_compiles, deferrals, fused_or, settled,
                                  wait_for_compiles)
from helpers import DEVICE, FakeJIT, fake_cuda_launch

cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="holds kernels 'compiling' through the interpreter")


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("SPIKEFUSE_COMPILE_PROCESSES", "0")  # the stand-in compiles in its thread
    jit = FakeJIT()
    kernel = fake_cuda_launch(monkeypatch, jit)
    yield jit, kernel
    jit.release.set()


def run(kernel, x):
    return fused_or(lambda: kernel[(1,)](x, 8, BLOCK=8) or "fused", lambda: "stand-in")


def test_a_launch_in_fused_or_runs_the_stand_in_until_its_kernel_is_compiled(fake):
    jit, kernel = fake
    x = torch.empty(8)
    before = deferrals()
    with background_compiles():
        assert run(kernel, x) == "stand-in" and run(kernel, x) == "stand-in"
        assert deferrals() == before + 2 and not settled(before)
        assert len(kernel._in_flight) == 1  # one compile, started by the first launch
        jit.release.set()
        next(iter(kernel._in_flight.values())).result(10)
        assert run(kernel, x) == "fused" and run(kernel, x) == "fused"
    assert [args for args, _, _ in jit.warmups] == [(torch.float32, 8)] and len(jit.launches) == 2
    assert settled(deferrals()) and kernel._in_flight == {}


def test_a_compile_within_the_grace_period_is_not_deferred(fake):
    jit, kernel = fake
    jit.release.set()  # compiles at once, as a disk-cache hit does
    before = deferrals()
    with background_compiles():
        assert run(kernel, torch.empty(8)) == "fused"
    assert deferrals() == before


def test_once_a_compile_outlasts_the_grace_period_later_launches_do_not_wait(fake, monkeypatch):
    jit, kernel = fake
    waits = []
    monkeypatch.setattr(launch.concurrent.futures, "wait", lambda futures, timeout: waits.append(timeout))
    with background_compiles():
        assert run(kernel, torch.empty(8)) == "stand-in" and waits == [launch.GRACE_S]
        assert run(kernel, torch.empty(8, dtype=torch.float64)) == "stand-in" and waits == [launch.GRACE_S]
    with background_compiles():  # a new run (fit) starts by waiting again
        run(kernel, torch.empty(8, dtype=torch.float16))
        assert waits == [launch.GRACE_S] * 2


def test_where_compile_processes_found_the_cache_cold_no_launch_waits(fake, monkeypatch):
    jit, kernel = fake
    waits = []
    monkeypatch.setattr(launch.concurrent.futures, "wait", lambda futures, timeout: waits.append(timeout))
    monkeypatch.setattr(launch.compile_processes, "began_cold", lambda: True)
    monkeypatch.setattr(launch, "INTERPRETED", False)  # as on a GPU: background_compiles() asks
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch.compile_processes, "start", lambda workers: True)
    monkeypatch.setattr(launch, "_triton_driver_ready", lambda: None)
    with background_compiles():
        assert run(kernel, torch.empty(8)) == "stand-in"
    assert waits == []


def test_the_compile_thread_also_loads_the_kernel_and_builds_its_launcher(fake):
    # Triton 3.6 builds a launcher per signature with the system compiler at the first launch (0.2-0.3 s)
    jit, kernel = fake
    loaded_in = []

    class Compiled:
        def _init_handles(self):
            loaded_in.append(threading.current_thread().name)
    jit.warmup = lambda *args, grid, **meta: Compiled()
    with background_compiles():
        run(kernel, torch.empty(8))
        assert wait_for_compiles(10)
    assert len(loaded_in) == 1 and loaded_in[0].startswith("spikefuse-compile")


def test_kernels_load_one_at_a_time_in_every_thread(monkeypatch):
    """Two threads loading launchers at once can swap them (launch._serialize_kernel_loads): once the
    compile threads exist, Triton's _init_handles runs under one lock, and a loaded kernel skips it."""
    pytest.importorskip("triton")
    from triton.compiler.compiler import CompiledKernel
    inside, most = [0], [0]

    def slow_load(self):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        threading.Event().wait(0.02)
        inside[0] -= 1
        self.module = "loaded"
    monkeypatch.setattr(CompiledKernel, "_init_handles", slow_load)
    launch._serialize_kernel_loads()
    launch._serialize_kernel_loads()  # once: not wrapped twice
    assert CompiledKernel._init_handles.__wrapped__ is slow_load

    class Kernel:
        module = None
    kernels = [Kernel() for _ in range(6)]
    threads = [threading.Thread(target=CompiledKernel._init_handles, args=(k,)) for k in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and all(k.module == "loaded" for k in kernels)
    with launch._kernel_loads_lock:  # held elsewhere: a loaded kernel does not wait for it
        CompiledKernel._init_handles(kernels[0])


def test_the_gil_changes_hands_often_while_a_compile_runs(fake):
    # beside a busy main thread a compile thread waits up to the switch interval at each return to
    # Python: 7x slower at the default 5 ms (compile_time_lif.py --beside-python)
    jit, kernel = fake
    default = sys.getswitchinterval()
    with background_compiles():
        run(kernel, torch.empty(8))
        assert sys.getswitchinterval() == pytest.approx(launch.SWITCH_INTERVAL_S)
        jit.release.set()
        assert wait_for_compiles(10)
    assert sys.getswitchinterval() == pytest.approx(default)


@pytest.mark.parametrize("where", ["background off", "outside fused_or"])
def test_otherwise_a_launch_compiles_before_it_runs(fake, where):
    jit, kernel = fake
    threading.Timer(0.3, jit.release.set).start()
    with background_compiles(where != "background off"):
        if where == "outside fused_or":
            kernel[(1,)](torch.empty(8), 8, BLOCK=8)
        else:
            assert run(kernel, torch.empty(8)) == "fused"
    assert len(jit.launches) == 1


def test_a_compile_failure_surfaces_at_the_launch(fake):
    jit, kernel = fake
    jit.warmup = lambda *args, **meta: 1 / 0  # the background compile fails at once ...
    with background_compiles():
        assert run(kernel, torch.empty(8)) == "fused"  # ... so the launch compiles itself (the fake succeeds)


# ---- every op's stand-in, with real kernels held "compiling" (CPU: the interpreter) ----

@pytest.fixture
def stalled(monkeypatch):
    """stall(*kernels): while background compiles are on, those CachedLaunches defer inside
    fused_or as a kernel still compiling does (their compile threads wait until teardown)."""
    release = threading.Event()
    compiles = {}  # kernel -> what its compile thread runs instead (on the class: an instance's patched
    original = CachedLaunch._compile_only  # method would outlive the test, bound to the class's)
    monkeypatch.setattr(CachedLaunch, "_compile_only", lambda self, *args: compiles[self](*args) if self in compiles
                        else original(self, *args))

    def stall(*kernels, compile=lambda device, grid, signature, meta: release.wait(30)):
        for kernel in kernels:
            monkeypatch.setattr(kernel, "interpreted", False)
            monkeypatch.setattr(kernel, "_in_flight", {})
            monkeypatch.setattr(kernel, "_compiled", {})
            compiles[kernel] = compile
    stall.release = release  # set at teardown: every held compile ends then
    yield stall
    release.set()


def lif_run(x, g, **options):
    x = x.detach().clone().requires_grad_()
    s = F.lif(x, backend="fused", **options)
    s.backward(g)
    return s, x.grad


LIF_OPTIONS = [dict(decay=0.8, threshold=0.5), dict(decay=0.7, reset="soft", surrogate="fast_sigmoid"),
               dict(decay=0.9, reset="subtract", detach_reset=False),
               dict(decay=0.9, threshold=0.5, grad_threshold=0.45, grad_scope="batch")]  # the sparse recipe's cut


@cpu_only
@pytest.mark.parametrize("options", LIF_OPTIONS, ids=["hard", "soft", "subtract", "cut per batch position"])
@pytest.mark.parametrize("stalled_kernel", ["forward", "backward"])
def test_lif_while_a_kernel_compiles(options, stalled_kernel, stalled, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x, g = torch.rand(13, 2, 3, 5, generator=gen), torch.randn(13, 2, 3, 5, generator=gen)
    s_fused, gx_fused = lif_run(x, g, **options)
    guessed = []
    monkeypatch.setattr(CachedLaunch, "speculate", lambda self, *args: guessed.append(self))
    stalled(getattr(lif_ops, f"_lif_{stalled_kernel}_kernel"))
    before = deferrals()
    with background_compiles():
        s, gx = lif_run(x, g, **options)
    assert deferrals() > before
    assert torch.equal(s, s_fused)
    torch.testing.assert_close(gx, gx_fused, rtol=1e-5, atol=1e-6)
    if stalled_kernel == "forward":  # its backward (and evaluation forward) were sent to compile alongside
        assert lif_ops._lif_backward_kernel in guessed


@cpu_only
@pytest.mark.parametrize("processes", [True, False], ids=["compile processes", "compile threads"])
def test_with_compile_processes_lif_sends_its_evaluation_forward_at_once(processes, stalled, monkeypatch):
    """With compile processes, the first deferral also sends the tuned forward without gradients (an
    evaluation's) to compile, not only once a quick kernel ran; in threads it waits (fewer compiles at once)."""
    guessed = []
    monkeypatch.setattr(CachedLaunch, "speculate", lambda self, device, grid, args, meta:
                        guessed.append((self, meta["K"], meta.get("SAVE_CKPT"))))
    monkeypatch.setattr(launch.compile_processes, "running", lambda: processes)
    stalled(lif_ops._lif_forward_kernel)
    x = torch.rand(13, 2, 3, 5)
    with background_compiles():
        lif_run(x, torch.randn(13, 2, 3, 5), decay=0.8, threshold=0.5)
    evaluation = [(k, save) for kernel, k, save in guessed if kernel is lif_ops._lif_forward_kernel and not save]
    tuned = kernel_base.launch_config(13, torch.float32)[1]
    assert evaluation == ([(tuned, False)] if processes else [])


@cpu_only
@pytest.mark.parametrize("options", LIF_OPTIONS, ids=["hard", "soft", "subtract", "cut per batch position"])
@pytest.mark.parametrize("tuned_backward", ["compiling", "compiled"])
def test_lif_runs_quick_kernels_while_its_tuned_ones_compile(options, tuned_backward, stalled, monkeypatch):
    """A quick forward (chunk length QUICK_K); the backward then takes the tuned kernel on every
    K-th of its checkpoints, or while that compiles the quick one: the same spikes and gradients."""
    gen = torch.Generator().manual_seed(3)
    x, g = torch.rand(37, 2, 3, 5, generator=gen), torch.randn(37, 2, 3, 5, generator=gen)
    s_fused, gx_fused = lif_run(x, g, **options)
    forward, backward = lif_ops._lif_forward_kernel, lif_ops._lif_backward_kernel
    pool = concurrent.futures.ThreadPoolExecutor(8)  # room beside the compiles held in flight
    monkeypatch.setattr(launch, "_compile_threads", lambda: pool)
    ready = threading.Event()  # what compiles once the first call is done; the rest stays in flight

    def compiles_after_the_first_call(kernel, meta):
        return meta["K"] == lif_ops.QUICK_K or (kernel is backward and tuned_backward == "compiled")
    for kernel in (forward, backward):
        stalled(kernel, compile=lambda device, grid, signature, meta, kernel=kernel:
                ready.wait(30) if compiles_after_the_first_call(kernel, meta) else stalled.release.wait(30))
        monkeypatch.setattr(kernel, "_current_device", lambda: None)  # as speculation names a CPU tensor's
    if tuned_backward == "compiled":  # its compile, sent once the quick forward ran, done before the backward
        defer = CachedLaunch._defer  # asks for it (else a race with the compile thread); patched on the
                                     # class: an instance's patched method would outlive the test, bound

        def defer_once_compiled(self, key, *args):
            if self is backward and key in self._in_flight:
                self._in_flight[key].result(10)
            return defer(self, key, *args)
        monkeypatch.setattr(CachedLaunch, "_defer", defer_once_compiled)
    with background_compiles():
        lif_run(x, g, **options)  # the twins: every variant compiling, the quick ones sent to compile too
        ready.set()
        for kernel in (forward, backward):
            for key, future in list(kernel._in_flight.items()):
                if compiles_after_the_first_call(kernel, constexprs(key)):
                    future.result(10)
        s, gx = lif_run(x, g, **options)
    assert torch.equal(s, s_fused)
    torch.testing.assert_close(gx, gx_fused, rtol=1e-5, atol=1e-6)

    def chunk_lengths(kernel):  # of the variants launched
        return {constexprs(key)["K"] for key in kernel._compiled}
    assert chunk_lengths(forward) == {lif_ops.QUICK_K}
    tuned = kernel_base.launch_config(30, torch.float32)[1]
    assert tuned != lif_ops.QUICK_K
    assert chunk_lengths(backward) == {tuned if tuned_backward == "compiled" else lif_ops.QUICK_K}


def constexprs(key):
    """The constexprs and launch options in a CachedLaunch key (its (name, value) pairs)."""
    return dict(item for item in key if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str))


def test_only_training_steps_take_the_quick_kernels_while_compiles_are_in_flight(monkeypatch):
    monkeypatch.setattr(lif_ops, "cold_compiles_in_flight", lambda: True)
    chunk_lengths = []  # (patched on the class: an instance's patched method would outlive the test, bound)
    monkeypatch.setattr(CachedLaunch, "_launch", lambda self, grid, args, meta: chunk_lengths.append(meta["K"]))
    x = torch.rand(20, 2, 3, device=DEVICE)
    with torch.no_grad():  # an evaluation: its tuned kernel was sent to compile early
        F.lif(x, backend="fused")
    F.lif(x.requires_grad_(), backend="fused")
    assert chunk_lengths == [kernel_base.launch_config(6, torch.float32)[1], lif_ops.QUICK_K]


@cpu_only
def test_a_learnable_threshold_stand_in_gives_its_gradient(stalled):
    gen = torch.Generator().manual_seed(1)
    x, g = torch.rand(9, 2, 3, generator=gen), torch.randn(9, 2, 3, generator=gen)

    def call():
        thr = torch.tensor([0.4, 0.5, 0.3], requires_grad=True)
        xx = x.clone().requires_grad_()
        s = F.lif(xx, decay=0.8, threshold=thr, backend="fused")
        s.backward(g)
        return s, xx.grad, thr.grad
    expected = call()
    stalled(lif_ops._lif_forward_kernel)
    with background_compiles():
        got = call()
    assert torch.equal(got[0], expected[0])
    for a, b in zip(got[1:], expected[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@cpu_only
@pytest.mark.parametrize("stalled_kernel", ["forward", "backward"])
def test_a_learnable_decay_and_initial_state_get_their_gradients(stalled_kernel, stalled):
    """PLIF's per-channel decay and v0 through the twins (the backward's: the loop's, recomputed)."""
    gen = torch.Generator().manual_seed(2)
    x, g, v0 = torch.rand(11, 2, 3, generator=gen), torch.randn(11, 2, 3, generator=gen), torch.rand(2, 3, generator=gen)

    def call():
        decay = torch.tensor([0.6, 0.8, 0.9], requires_grad=True)
        xx, vv = x.clone().requires_grad_(), v0.clone().requires_grad_()
        s = F.lif(xx, decay=decay, threshold=0.5, v0=vv, reset="soft", backend="fused")
        s.backward(g)
        return s, xx.grad, decay.grad, vv.grad
    expected = call()
    stalled(getattr(lif_ops, f"_lif_{stalled_kernel}_kernel"))
    before = deferrals()
    with background_compiles():
        got = call()
    assert deferrals() > before
    assert torch.equal(got[0], expected[0])
    for a, b in zip(got[1:], expected[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def bn_run(module, x):
    x = x.detach().clone().requires_grad_()
    s = module(x)
    s.backward(torch.linspace(-1, 1, s.numel()).view_as(s))
    return s, x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}, \
        {n: b.clone() for n, b in module.named_buffers()}


@cpu_only
@pytest.mark.parametrize("stalled_kernel", ["_stats_partial_kernel", "_stats_finalize_kernel",
                                            "_bn_lif_forward_kernel", "_bn_lif_backward_kernel",
                                            "_bn_grad_x_kernel"])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_bn_lif_while_a_kernel_compiles(stalled_kernel, momentum, stalled):
    """Same spikes and gradients, and the running statistics take the batch exactly once."""
    torch.manual_seed(0)
    module = BNLIF(3, decay=0.6, threshold=0.3, momentum=momentum, learn_decay=True, backend="fused")
    twin = copy.deepcopy(module)
    x = torch.randn(7, 4, 3, 5) + 0.2
    s_fused, gx_fused, grads_fused, buffers_fused = bn_run(module, x)
    stalled(getattr(bn_lif_ops, stalled_kernel))
    before = deferrals()
    with background_compiles():
        s, gx, grads, buffers = bn_run(twin, x)
    assert deferrals() > before
    assert torch.equal(s, s_fused)
    torch.testing.assert_close(gx, gx_fused, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_fused[name], rtol=1e-5, atol=1e-5)
    assert buffers["num_batches_tracked"] == buffers_fused["num_batches_tracked"] == 1
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(buffers[name], buffers_fused[name], rtol=1e-6, atol=1e-7)


@cpu_only
def test_the_bn_lif_stand_in_runs_its_lif_on_the_loop_path(stalled, monkeypatch):
    """Not the reference's autograd node per op and step (F.lif_stand_in): the loop path, on CUDA too."""
    from spikefuse.ops import lif_loop
    loops = []
    monkeypatch.setattr(lif_loop, "lif_loop", lambda *args, _run=lif_loop.lif_loop: loops.append(1) or _run(*args))
    module = BNLIF(3, decay=0.6, threshold=0.3, backend="fused")
    stalled(bn_lif_ops._bn_lif_forward_kernel)
    with background_compiles():
        bn_run(module, torch.randn(7, 4, 3, 5) + 0.2)
    assert loops
    loops.clear()
    bn_run(BNLIF(3, decay=0.6, threshold=0.3, backend="reference"), torch.randn(7, 4, 3, 5))
    assert not loops  # the reference backend stays the reference


class _HalfTwin(torch.nn.Module):
    """A BNLIF called as a spiking conv's block calls it (its backward writes dL/dx's fp16 twin)."""

    def __init__(self, bn):
        super().__init__()
        self.bn = bn

    def forward(self, x):
        return self.bn(x, half_twin=True)


@cpu_only
@pytest.mark.parametrize("channels_last,half_twin", [(False, False), (True, False), (True, True)])
def test_bn_lif_sends_its_other_kernels_to_compile_while_its_statistics_compile(channels_last, half_twin, stalled,
                                                                                monkeypatch):
    """Else each kernel would start compiling only once the one before it is ready: the guesses
    are the variants the layer then launches (its statistics, forward, backward and dL/dx, and
    its evaluation's forward; with half_twin, the backward's variants that write the fp16 twin)."""
    from spikefuse.ops import half_grad
    from spikefuse.ops.launch import _argument_classes

    def variant(kernel, args, meta):
        return kernel, tuple(meta.items()), tuple(_argument_classes(args))
    guessed, launched = [], []
    monkeypatch.setattr(CachedLaunch, "speculate", lambda self, device, grid, args, meta:
                        guessed.append(variant(self, args, meta)))
    launch_once = CachedLaunch._launch

    def record(self, grid, args, meta):
        launched.append(variant(self, args, meta))
        return launch_once(self, grid, args, meta)
    monkeypatch.setattr(CachedLaunch, "_launch", record)
    torch.manual_seed(0)
    module = BNLIF(8, decay=0.6, threshold=0.3, backend="fused")
    if half_twin:  # (CUDA only otherwise)
        monkeypatch.setattr(half_grad, "enabled", lambda x: x.dtype == torch.float32)
        module = _HalfTwin(module)
    x = torch.randn(6, 2, 8, 3, 2) + 0.2
    if channels_last:
        x = x.movedim(2, -1).contiguous().movedim(-1, 2)
    stalled(bn_lif_ops._stats_partial_kernel)
    with background_compiles():
        bn_run(module, x)
    kernels = {guess[0] for guess in guessed}
    assert {bn_lif_ops._stats_finalize_kernel, bn_lif_ops._bn_lif_forward_kernel,
            bn_lif_ops._bn_lif_backward_kernel, bn_lif_ops._bn_grad_x_kernel} <= kernels
    assert any(("HALF", True) in guess[1] for guess in guessed) == half_twin
    finalize_variants = {guess for guess in guessed if guess[0] is bn_lif_ops._stats_finalize_kernel}
    assert len(finalize_variants) == 2  # the training step's and the evaluation's statistics
    launched.clear()
    monkeypatch.undo()  # the kernels "compiled": the layer runs them all
    monkeypatch.setattr(CachedLaunch, "_launch", record)
    if half_twin:
        monkeypatch.setattr(half_grad, "enabled", lambda x: x.dtype == torch.float32)
    bn_run(module, x)
    module.eval()
    with torch.no_grad():  # an evaluation's statistics and forward are among the guesses too
        module(x)
    assert all(guess in launched for guess in guessed if guess[0] is not bn_lif_ops._stats_partial_kernel), \
        [guess[0].kernel.fn.__name__ for guess in guessed if guess not in launched]


@cpu_only
@pytest.mark.parametrize("stalled_kernel", ["_pack_kernel", "_unpack_kernel"])
def test_spiking_linear_while_bit_packing_compiles(stalled_kernel, stalled):
    torch.manual_seed(0)
    layer = SpikingLinear(12, 5)
    s = (torch.rand(6, 3, 12) < 0.3).float()

    def call():
        layer.zero_grad()
        xs = s.clone().requires_grad_()
        y = layer(xs)
        y.backward(torch.ones_like(y))
        return y, xs.grad, layer.weight.grad.clone()
    expected = call()
    stalled(getattr(spike_pack, stalled_kernel))
    with background_compiles():
        got = call()
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@cpu_only
@pytest.mark.parametrize("stalled_kernel", ["spike_index._line_flags_kernel", "spike_index._active_indices_kernel",
                                            "sparse_linear._gather_columns_kernel", "sparse_linear._input_grad_kernel",
                                            "sparse_linear._weight_grad_kernel"])
def test_sparse_linear_takes_the_dense_backward_while_a_sparse_kernel_compiles(stalled_kernel, stalled):
    """Same gradients, and the carrying columns counted once per backward (dispatch reads them)."""
    module, name = stalled_kernel.split(".")
    g = torch.Generator().manual_seed(3)
    s = (torch.rand(4, 3, 37, generator=g) < 0.3).float()
    cols = torch.rand(41, generator=g) < 0.3
    gy = torch.randn(4, 3, 41, generator=g) * cols

    def call():
        x = s.clone().requires_grad_()
        w = torch.randn(41, 37, generator=torch.Generator().manual_seed(0)).requires_grad_()
        carry = torch.zeros(3, dtype=torch.float64)
        y = sparse_linear.sparse_spike_linear(x, w, None, carry=carry)
        y.backward(gy)
        return x.grad, w.grad, carry
    expected = call()
    stalled(getattr({"spike_index": spike_index, "sparse_linear": sparse_linear}[module], name))
    before = deferrals()
    with background_compiles():
        got = call()
    assert deferrals() > before
    for a, b in zip(got[:2], expected[:2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[2], expected[2])


def test_a_step_is_captured_only_after_a_call_that_deferred_nothing(monkeypatch):
    """CapturedStep: warm-up calls go on while a launch deferred or a compile is in flight."""
    monkeypatch.setattr(launch, "_compiling", 0)  # no compile in flight (earlier tests' may still end)
    calls = []
    step = CapturedStep(lambda x: calls.append("eager"), warmup=1)
    monkeypatch.setattr(step, "_unsupported", lambda inputs: None)
    monkeypatch.setattr(step, "_warm_up", lambda inputs: step.step_fn(*inputs))
    monkeypatch.setattr(step, "_capture", lambda entry, inputs, provisional: calls.append("capture"))
    deferring = [True, True, False]  # the first two calls each run a stand-in

    def step_fn(x):
        calls.append("eager")
        if deferring.pop(0):
            monkeypatch.setattr(launch, "_deferred", launch._deferred + 1)
    step.step_fn = step_fn
    for _ in range(4):
        step(torch.empty(1))
    assert calls == ["eager", "eager", "eager", "capture"]


def _recording_step(monkeypatch, compiling, stand_in_ran, stood_in_for=tuple):
    """A CapturedStep from a cold cache (`compiling` compiles in flight) whose step and capture only note
    what ran: "eager" (a stand-in too where stand_in_ran()), ("capture", provisional), "replay"."""
    monkeypatch.setattr(launch, "_compiling", compiling)
    monkeypatch.setattr(launch, "_background", True)
    monkeypatch.setattr(launch, "_cache_cold", True)
    calls = []
    step = CapturedStep(lambda x: None, warmup=1)
    monkeypatch.setattr(step, "_unsupported", lambda inputs: None)
    monkeypatch.setattr(step, "_warm_up", lambda inputs: step.step_fn(*inputs))

    def step_fn(x):
        calls.append("eager")
        if stand_in_ran():
            monkeypatch.setattr(launch, "_deferred", launch._deferred + 1)

    def capture(entry, inputs, provisional):
        calls.append(("capture", provisional))
        entry.graph = type("Graph", (), {"replay": lambda self: calls.append("replay")})()
        entry.provisional = provisional
        entry.stood_in_for = stood_in_for()
    step.step_fn = step_fn
    monkeypatch.setattr(step, "_capture", capture)
    return step, calls


@pytest.mark.parametrize("setting", [None, "0"])
def test_from_a_cold_cache_a_step_is_captured_with_its_stand_ins_then_again_with_its_kernels(setting, monkeypatch):
    """CapturedStep: while kernels compile from a cold cache, the step is captured after its warm-ups with
    the stand-ins it runs (a provisional graph, replayed), and again once nothing compiles. With
    SPIKEFUSE_PROVISIONAL_GRAPHS=0, it runs eagerly until nothing compiles."""
    opted_in = setting is None
    if opted_in:
        monkeypatch.delenv("SPIKEFUSE_PROVISIONAL_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("SPIKEFUSE_PROVISIONAL_GRAPHS", setting)
    step, calls = _recording_step(monkeypatch, 1, stand_in_ran=lambda: launch._compiling > 0)
    for _ in range(3):
        step(torch.empty(1))
    monkeypatch.setattr(launch, "_compiling", 0)  # the kernels are compiled
    for _ in range(3):
        step(torch.empty(1))
    if opted_in:
        assert calls == ["eager", ("capture", True), "replay", "eager", ("capture", False), "replay"]
    else:
        assert calls == ["eager", "eager", "eager", "eager", ("capture", False), "replay"]


def test_a_provisional_graph_is_captured_again_once_the_kernels_its_stand_ins_stood_in_for_are_ready(monkeypatch):
    """A LIF layer's quick kernels are ready seconds before its tuned ones: the graph of stand-ins is
    captured again then (with the quick kernels, still provisional), and once more when nothing compiles."""
    monkeypatch.delenv("SPIKEFUSE_PROVISIONAL_GRAPHS", raising=False)
    quick = concurrent.futures.Future()
    step, calls = _recording_step(monkeypatch, 2,  # a quick kernel and a tuned one
                                  stand_in_ran=lambda: not quick.done(),
                                  stood_in_for=lambda: () if quick.done() else (quick,))
    for _ in range(3):
        step(torch.empty(1))
    quick.set_result(None)
    monkeypatch.setattr(launch, "_compiling", 1)  # the quick kernel is in, the tuned one compiles
    for _ in range(3):
        step(torch.empty(1))
    monkeypatch.setattr(launch, "_compiling", 0)
    for _ in range(3):
        step(torch.empty(1))
    assert calls == ["eager", ("capture", True), "replay",  # stand-ins
                     "eager", ("capture", True), "replay",  # quick kernels, while the tuned one compiles
                     "eager", ("capture", False), "replay"]  # tuned kernels


def test_fit_takes_background_compile_as_a_bool_off_by_default():
    from spikefuse.train.loop import Trainer
    from spikefuse.data import load
    splits = load("randman", progress=False)
    from spikefuse.models import build_model
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps)
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises((TypeError, ValueError), match="background_compile"):
        Trainer(model, splits, opt, epochs=1, background_compile="yes")
    assert Trainer(model, splits, opt, epochs=1).background_compile is False


def test_compiling_is_an_exception_callers_never_see_outside_fused_or():
    assert issubclass(Compiling, Exception)
    assert fused_or(lambda: 1, lambda: 2) == 1  # background off: fused() alone


COLD_FIT = """
import json, sys, torch
from spikefuse.data import load
from spikefuse.models import build_model
from spikefuse.ops import compile_processes, launch
from spikefuse.train.loop import Trainer
in_child, compile_in_child = [], compile_processes.compile_in_child  # which compiles a forked process did
compile_processes.compile_in_child = lambda *args: in_child.append(compile_in_child(*args)) or in_child[-1]
splits = load("randman", device="cuda", progress=False)
torch.manual_seed(0)
model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps)
trainer = Trainer(model, splits, torch.optim.Adam(model.parameters(), lr=2e-3), epochs=1, batch_size=64,
                  device="cuda", progress=False, background_compile=sys.argv[1] == "on")
history = trainer.fit()  # randman's epoch is short: it may end before the compiles do
assert launch.wait_for_compiles(300)
for epochs in (3, 5):  # then until every compile (evaluation's, the last batch's) has ended and a step was captured
    trainer.epochs = epochs
    history = trainer.fit()
    assert launch.wait_for_compiles(300)
print(json.dumps({"deferrals": launch.deferrals(), "graphs": trainer.step.captured, "in_child": in_child,
                  "provisional": trainer.step.provisional_captures, "fallback": trainer.step.fallback_reason,
                  "provisional_failure": trainer.step.provisional_failure,
                  "child_failure": compile_processes.last_failure,
                  "acc": [h["test_acc"] for h in history], "loss": [h["train_loss"] for h in history]}))
"""


@pytest.mark.gpu
def test_fit_from_a_cold_cache_trains_while_its_kernels_compile(tmp_path):
    """The user's path on CUDA from an empty Triton cache: fit runs quick kernels or torch twins while
    their kernels compile in forked processes, captures its step with them meanwhile, then again with its
    kernels; it learns as a run with background compiles off does (same batches; the twins' gradients
    differ in the last bits, so close, not equal). SPIKEFUSE_COMPILE_PROCESSES=0 and
    SPIKEFUSE_PROVISIONAL_GRAPHS=0 leave compiles in threads and capture only once they are done."""
    import json
    import os
    import subprocess
    import sys

    runs = {}
    turned_off = {"SPIKEFUSE_COMPILE_PROCESSES": "0", "SPIKEFUSE_PROVISIONAL_GRAPHS": "0"}
    for mode in ("on", "on, in threads", "off"):
        env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / f"cache-{mode}"), "PYTHONPATH": os.pathsep.join(sys.path),
               **(turned_off if mode == "on, in threads" else {})}
        out = subprocess.run([sys.executable, "-c", COLD_FIT, mode.split(",")[0]], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    on, threads = runs["on"], runs["on, in threads"]
    assert on["deferrals"] > 0 and threads["deferrals"] > 0 and runs["off"]["deferrals"] == 0  # twins ran
    assert on["in_child"] and all(on["in_child"][:3]), on["child_failure"]  # compiled in forked processes
    assert not any(threads["in_child"]) and not any(runs["off"]["in_child"])
    assert on["provisional"] >= 1 and threads["provisional"] == 0, on  # graphs of stand-ins unless turned off
    for mode, run in runs.items():  # the steps were captured once compiled, and learnt alike
        assert run["graphs"] >= 1, (mode, run["fallback"], run["provisional_failure"], run["deferrals"])
        assert all(loss == loss for loss in run["loss"])
        off = runs["off"]["loss"][-1]
        assert abs(run["loss"][-1] - off) < 0.1 * off and abs(run["acc"][-1] - runs["off"]["acc"][-1]) < 0.1, mode


def _layers_with_stand_ins(name):
    """A small network of one kind of layer whose ops have stand-ins, on CUDA."""
    from spikefuse.nn import LIF, SparseSpikingLinear
    if name == "lif":
        return torch.nn.Sequential(torch.nn.Linear(20, 33), LIF(decay=0.9))
    if name == "lif, hard reset to a value, cut":
        return torch.nn.Sequential(torch.nn.Linear(20, 33), LIF(decay=0.8, reset="hard", v_reset=0.1,
                                                                 grad_threshold=0.5))
    if name == "bn+lif":
        return torch.nn.Sequential(torch.nn.Linear(20, 33), BNLIF(33))
    if name == "spiking linear":
        return torch.nn.Sequential(torch.nn.Linear(20, 33), LIF(decay=0.9), SpikingLinear(33, 7), LIF(decay=0.9))
    return torch.nn.Sequential(torch.nn.Linear(20, 33), LIF(decay=0.9), SparseSpikingLinear(33, 7), LIF(decay=0.9))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lif", "lif, hard reset to a value, cut", "bn+lif", "spiking linear",
                                  "sparse linear"])
def test_every_stand_in_can_be_captured_in_a_provisional_graph(name, monkeypatch):
    """From a cold cache CapturedStep captures the stand-ins (capture.py): none may copy from the host
    or sync. Every launch is held "compiling"; a captured forward+backward replays as the eager one."""
    def always_compiling(self, key, *args):
        monkeypatch.setattr(launch, "_deferred", launch._deferred + 1)
        raise Compiling(key)
    monkeypatch.setattr(CachedLaunch, "_defer", always_compiling)
    monkeypatch.setenv("SPIKEFUSE_COMPILE_PROCESSES", "0")
    torch.manual_seed(0)
    model = _layers_with_stand_ins(name).cuda()
    x = torch.rand(9, 3, 20, device="cuda") * 2

    def step(x):
        for p in model.parameters():
            p.grad = None
        out = model(x)
        (out * torch.linspace(-1, 1, out.shape[-1], device="cuda")).sum().backward()
        # detached: a kept autograd graph keeps the parameters' AccumulateGrad nodes bound to the eager
        # step's stream, and the capture's backward would then sync with it (an illegal op in a capture)
        return out.detach(), [p.grad for p in model.parameters()]
    state = copy.deepcopy(model.state_dict())
    with background_compiles():
        before = deferrals()
        out, grads = step(x)
        expected = [t.clone() for t in (out, *grads)]
        assert deferrals() > before
        model.load_state_dict(state)
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(x)
        torch.cuda.current_stream().wait_stream(side)
        model.load_state_dict(state)
        with launch.stand_ins_captured(), torch.cuda.graph(graph):
            out, grads = step(x)
        model.load_state_dict(state)
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected[0])
    for got, want in zip(grads, expected[1:]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
