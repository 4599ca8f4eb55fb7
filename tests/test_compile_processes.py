"""Compiles in forked processes (ops/compile_processes.py; SPIKEFUSE_COMPILE_PROCESSES=0 turns them off): the
plumbing, on the CPU, with a stand-in for a @triton.jit function. The GPU tests compile real kernels
this way (test_background_compile.py)."""
import os
import pathlib
import time

import pytest
import torch

from spikefuse.ops import compile_processes
from helpers import DEVICE


def _stand_in_fn():
    pass


_stand_in_fn.__qualname__ = "stand_in"  # the name under which a child finds the "kernel" in this module


class _StandIn:
    """What a child finds by module and name: its warmup notes where it ran and what it was given."""
    fn = _stand_in_fn

    def warmup(self, *signature, grid, **meta):
        if meta.get("die"):
            os._exit(3)
        time.sleep(meta.get("sleep", 0))  # a compile's length
        pathlib.Path(meta["out"]).write_text(f"{os.getpid()} {signature} {grid}")


stand_in = _StandIn()


class _Unreachable(_StandIn):
    fn = type("fn", (), {"__module__": __name__, "__qualname__": "no_such_kernel"})


@pytest.fixture(autouse=True)
def opted_in(monkeypatch, tmp_path):
    monkeypatch.setenv("SPIKEFUSE_COMPILE_PROCESSES", "1")
    monkeypatch.setattr(compile_processes, "_forked", False)  # each test as a fresh process
    monkeypatch.setattr(compile_processes, "_created", False)
    monkeypatch.setattr(compile_processes, "_began_cold", False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cold-cache"))  # no marker: a cold machine


@pytest.fixture
def processes():
    assert compile_processes.start(2)
    yield
    compile_processes.stop()


def test_a_compile_runs_in_another_process_with_its_arguments(processes, tmp_path):
    out = tmp_path / "ran"
    assert compile_processes.compile_in_child(stand_in, 0, ["fp32", 16], {"out": str(out)})
    pid, rest = out.read_text().split(" ", 1)
    assert int(pid) != os.getpid()
    assert rest == "('fp32', 16) (1,)"


@pytest.mark.parametrize("case", ["kernel not found by name", "arguments do not pickle", "the child dies",
                                  "no processes"])
def test_what_a_child_cannot_compile_is_left_to_the_thread(case, tmp_path):
    kernel, meta = stand_in, {"out": str(tmp_path / "ran")}
    if case == "kernel not found by name":
        kernel = _Unreachable()
    elif case == "arguments do not pickle":
        meta["hook"] = lambda: None
    elif case == "the child dies":
        meta["die"] = True
    if case != "no processes":
        assert compile_processes.start(2)
    try:
        assert not compile_processes.compile_in_child(kernel, 0, ["fp32"], meta)
    finally:
        compile_processes.stop()
    assert not compile_processes.running()


@pytest.mark.parametrize("setting", [None, "0"])
def test_on_unless_turned_off(setting, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    if setting is None:
        monkeypatch.delenv("SPIKEFUSE_COMPILE_PROCESSES")
    else:
        monkeypatch.setenv("SPIKEFUSE_COMPILE_PROCESSES", setting)
    try:
        assert compile_processes.start(2) == (setting is None) == compile_processes.running()
        assert compile_processes.began_cold() == (setting is None)  # (then no launch waits for a cache hit)
    finally:
        compile_processes.stop()


@pytest.mark.parametrize("cache", ["missing", "empty", "marked"])
def test_no_processes_where_our_kernels_were_compiled_into_the_cache_before(cache, monkeypatch, tmp_path):
    """A machine that trained before loads its kernels from Triton's cache: forking would only cost time.
    A marker file of ours says so (one stat: a scan of a cache torch.compile filled takes seconds)."""
    root = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root))
    if cache != "missing":
        root.mkdir()
        (root / "somehash").mkdir()
    if cache == "marked":
        (root / compile_processes.MARKER).write_text("")
    assert compile_processes.cache_is_warm() == (cache == "marked")
    try:
        assert compile_processes.start(2) == (cache != "marked")
        assert not compile_processes.start(2) or cache != "marked"  # decided once per process
    finally:
        compile_processes.stop()


def test_the_marker_is_left_once_and_never_overwrites(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_processes, "_marked", False)
    monkeypatch.setattr(compile_processes, "_created", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    marker = tmp_path / compile_processes.MARKER
    compile_processes.mark_cache_warm()
    assert marker.exists() and not compile_processes.cache_is_warm()  # this process began cold
    monkeypatch.setattr(compile_processes, "_created", False)  # the next process: warm
    assert compile_processes.cache_is_warm()
    marker.write_text("someone else's")
    monkeypatch.setattr(compile_processes, "_marked", False)
    compile_processes.mark_cache_warm()
    assert marker.read_text() == "someone else's" and compile_processes.cache_is_warm()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(compile_processes, "_marked", False)
    marker.unlink()
    compile_processes.mark_cache_warm()  # a CPU machine: nothing was compiled, no marker
    assert not marker.exists()


def test_a_child_finds_our_kernels_by_module_and_name():
    from spikefuse.ops import lif
    kernel = lif._lif_forward_kernel.kernel  # (the module's name is the CachedLaunch wrapping it)
    assert compile_processes.jit_function(kernel.fn.__module__, kernel.fn.__qualname__) is kernel


@pytest.mark.skipif(DEVICE != "cpu", reason="a CPU-only machine")
def test_background_compiles_fork_no_processes_without_cuda():
    from spikefuse.ops.launch import background_compiles
    with background_compiles():
        assert not compile_processes.running()


def test_where_no_process_can_be_forked_compiles_stay_in_threads(monkeypatch):
    def refuse():
        raise BlockingIOError("Resource temporarily unavailable")  # fork's EAGAIN: a process limit
    monkeypatch.setattr(os, "fork", refuse)
    assert not compile_processes.start(2) and not compile_processes.running()
    assert not compile_processes.began_cold()


def test_forked_once_per_process():
    """A run that calls fit once per epoch forks at its first fit only (0.1-0.2 s a fork)."""
    assert compile_processes.start(2) and compile_processes.start(2)  # running: the same processes
    compile_processes.stop()
    assert not compile_processes.start(2) and not compile_processes.running()


def test_the_caller_prepares_while_the_child_compiles(processes, tmp_path):
    """The compile goes to a child first; the caller's own share (meanwhile) runs while it compiles."""
    out, order = tmp_path / "ran", []
    meta = {"out": str(out), "sleep": 0.5}

    def meanwhile():
        order.append("meanwhile, child done: %s" % out.exists())
    assert compile_processes.compile_in_child(stand_in, 0, ["fp32"], meta, meanwhile)
    assert order == ["meanwhile, child done: False"] and out.exists()


def test_without_processes_the_caller_still_prepares():
    order = []
    assert not compile_processes.compile_in_child(stand_in, 0, ["fp32"], {}, lambda: order.append(1))
    assert order == [1]


