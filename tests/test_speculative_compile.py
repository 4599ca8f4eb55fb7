"""Speculative compiles (ops/launch.py, SPIKEFUSE_SPECULATIVE_COMPILE=1): after a LIF or BN+LIF
forward that compiled a new variant, its backward kernels and its no-gradient forward are
compiled in the background. What the CPU can show: the variants guessed are the ones the layer then launches
(every launch's variant key recorded, through the interpreter), nothing is guessed with the
switch off, and a launch waits for its variant's compile in flight. The compile threads
themselves run on a GPU (benchmarks/compile_time_lif.py --cold)."""
import os
import threading

import pytest
import torch

import spikefuse.functional as F
from spikefuse.nn import BNLIF
from spikefuse.ops import launch as launch_module
from spikefuse.ops.launch import CachedLaunch, _argument_classes
from helpers import DEVICE, FakeJIT, fake_cuda_launch

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="records launches through the interpreter")


def variant(kernel, args, meta):
    """What a variant depends on: the kernel, its constexprs and options, its arguments' classes."""
    return (kernel, tuple(meta.items()), tuple(_argument_classes(args)))


@pytest.fixture
def recorded(monkeypatch):
    """(launched, speculated): the variants launched and the ones speculated, in order."""
    launched, speculated = [], []
    launch_once = CachedLaunch._launch

    def record_launch(self, grid, args, meta):
        launched.append(variant(self, args, meta))
        return launch_once(self, grid, args, meta)
    monkeypatch.setattr(CachedLaunch, "_launch", record_launch)
    monkeypatch.setattr(CachedLaunch, "speculate",
                        lambda self, device, grid, args, meta: speculated.append(variant(self, args, meta)))
    return launched, speculated


CASES = {
    "lif": (dict(decay=0.9, threshold=0.5), {}),
    "soft reset, fast sigmoid": (dict(decay=0.8, reset="soft", surrogate="fast_sigmoid"), {}),
    "subtract, not detached": (dict(decay=0.7, reset="subtract", detach_reset=False), {}),
    "cut per batch position": (dict(decay=0.9, grad_threshold=0.2, grad_scope="batch"), {}),
    "plif, learnable threshold": (dict(), {"decay": [0.6, 0.9, 0.8], "threshold": [0.5, 0.4, 0.3]}),
    "plif, v0 with a gradient": (dict(), {"decay": [0.6], "v0": True}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(13, 2, 3, 5), (16, 2, 3, 64)])  # ragged; whole blocks, spikes packed as bits
def test_the_speculated_variants_are_the_ones_launched_next(case, dtype, shape, recorded, monkeypatch):
    monkeypatch.setenv("SPIKEFUSE_SPECULATIVE_COMPILE", "1")
    launched, speculated = recorded
    options, tensors = CASES[case]
    x = (torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 0.8).to(dtype).requires_grad_()
    leaves = {"x": x}
    if "decay" in tensors:
        leaves["decay"] = torch.tensor(tensors["decay"], requires_grad=True)
    if "threshold" in tensors:
        options = {**options, "threshold": torch.tensor(tensors["threshold"], requires_grad=True)}
    if tensors.get("v0"):
        options = {**options, "v0": torch.rand(shape[1:], requires_grad=True)}

    def call(x):
        if "decay" in leaves:
            return F.plif(x, leaves["decay"], backend="fused", **options)
        return F.lif(x, backend="fused", **options)
    s = call(x)
    # at the (first, so new) forward: itself (compiled: nothing to do), its backward, its no-gradient forward
    assert len(speculated) == 3
    forward_guess, backward_guess, eval_guess = speculated
    s.backward(torch.rand_like(s))
    assert launched[:2] == [forward_guess, backward_guess]
    with torch.no_grad():
        call(x)
    assert launched[2] == eval_guess


BN_CASES = {
    "channels first": dict(shape=(11, 2, 3, 4, 5)),
    "channels last": dict(shape=(11, 2, 3, 4, 5), channels_last=True),
    "residual, learnable decay": dict(shape=(9, 2, 8, 3), residual=True, learn_decay=True),
    "one input step repeated": dict(shape=(1, 3, 8, 2), time_steps=6),
}


@pytest.mark.parametrize("case", list(BN_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bn_lif_speculates_its_backward_and_evaluation(case, dtype, recorded, monkeypatch):
    """BN+LIF: the guesses at its first forward (the backward and dL/dx kernels, the
    no-gradient forward) are among the variants then launched."""
    monkeypatch.setenv("SPIKEFUSE_SPECULATIVE_COMPILE", "1")
    launched, speculated = recorded
    spec = BN_CASES[case]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(spec["shape"], generator=gen).to(dtype)
    if spec.get("channels_last"):
        x = x.movedim(2, -1).contiguous().movedim(-1, 2)
    module = BNLIF(spec["shape"][2], decay=0.6, threshold=0.3, learn_decay=spec.get("learn_decay", False),
                   backend="fused")
    residual = torch.rand(spec["shape"], generator=gen).to(dtype) if spec.get("residual") else None
    x.requires_grad_()
    s = module(x[0] if spec.get("time_steps") else x, residual, time_steps=spec.get("time_steps"))
    first_launches = len(launched)
    guesses = list(speculated)
    assert len(guesses) == 3  # the backward, dL/dx and the no-gradient forward
    s.backward(torch.rand_like(s))
    module.eval()
    with torch.no_grad():
        module(x[0] if spec.get("time_steps") else x, residual, time_steps=spec.get("time_steps"))
    later = launched[first_launches:]
    assert all(guess in later for guess in guesses), [guess in later for guess in guesses]


def test_nothing_is_speculated_by_default(recorded, monkeypatch):
    monkeypatch.delenv("SPIKEFUSE_SPECULATIVE_COMPILE", raising=False)
    launched, speculated = recorded
    x = torch.rand(5, 7, requires_grad=True)
    F.lif(x, backend="fused").sum().backward()
    assert len(launched) == 2 and speculated == []



def test_a_launch_waits_for_its_variants_compile_in_flight(monkeypatch):
    fake = FakeJIT()
    kernel = fake_cuda_launch(monkeypatch, fake)
    x = torch.empty(8)
    kernel.speculate(0, (1,), (x, 8), {"BLOCK": 8})
    kernel.speculate(0, (1,), (x, 8), {"BLOCK": 8})  # in flight already: not submitted again
    future = next(iter(kernel._in_flight.values()))
    assert len(kernel._in_flight) == 1 and not future.done()
    threading.Timer(0.2, fake.release.set).start()
    kernel[(1,)](x, 8, BLOCK=8)  # waits for the compile, then goes through Triton as before
    assert future.done() and kernel._in_flight == {}
    assert fake.warmups == [((torch.float32, 8), (1,), {"BLOCK": 8})]  # a dtype stands for the tensor
    assert len(fake.launches) == 1 and kernel.misses == 1


def test_a_failed_speculation_leaves_the_launch_to_compile(monkeypatch):
    fake = FakeJIT()
    fake.warmup = lambda *args, **meta: 1 / 0
    kernel = fake_cuda_launch(monkeypatch, fake)
    x = torch.empty(8)
    kernel.speculate(0, (1,), (x, 8), {"BLOCK": 8})
    next(iter(kernel._in_flight.values())).exception(10)
    kernel[(1,)](x, 8, BLOCK=8)
    assert len(fake.launches) == 1


def test_the_compile_threads_leave_a_core_for_the_caller():
    assert launch_module._compile_threads()._max_workers == max(1, min(8, len(os.sched_getaffinity(0)) - 1))


def test_the_compile_threads_count_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr(launch_module.os, "sched_getaffinity", lambda pid: {0, 1, 2})  # taskset -c 0-2
    assert launch_module.usable_cpus() == 3
