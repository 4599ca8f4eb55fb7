"""ZygotePool (ops/zygote_pool.py): the compile processes' pool, whose workers are forked by one
forked process instead of by the trainer. The plumbing, on the CPU."""
import os
import signal
import sys
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from spikefuse.ops import compile_processes
from spikefuse.ops.zygote_pool import ZygotePool

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the compile processes are forked: Linux only")


def _set_up(tag):
    os.environ["ZYGOTE_SET_UP"] = tag  # the workers inherit what the zygote set up


def _inherited():
    return os.environ.get("ZYGOTE_SET_UP")


def _die():
    os._exit(3)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or going between the open and the read
        return False


def _until(condition, timeout=20.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.fixture
def pool():
    forks = []
    os.register_at_fork(before=lambda: forks.append(1) if forks is not None else None)
    pool = ZygotePool(2, _set_up, ("yes",), compile_processes._end_with)
    pool.forks_by_caller = len(forks)
    yield pool
    forks = None  # (the fork hook stays registered: it then counts nothing)
    pool.shutdown()


def test_the_caller_forks_once_and_the_workers_are_the_zygotes_children(pool):
    assert pool.forks_by_caller == 1
    worker_parent = pool.submit(os.getppid).result(30)
    assert worker_parent == pool._pid != os.getpid()
    assert pool.submit(_inherited).result(30) == "yes"
    assert pool.submit(max, 3, 7).result(30) == 7


def test_a_worker_that_dies_fails_its_future_not_the_caller(pool):
    with pytest.raises(BrokenProcessPool):
        pool.submit(_die).result(30)


def test_arguments_that_do_not_pickle_raise_in_submit(pool):
    with pytest.raises(Exception):
        pool.submit(max, lambda: None)
    assert pool.submit(max, 1, 2).result(30) == 2  # the pipe is intact


def test_shutdown_ends_the_zygote_and_its_workers_and_leaves_no_zombie(pool):
    workers = {pool.submit(os.getpid).result(30) for _ in range(4)}
    slow = pool.submit(time.sleep, 30)
    pool.shutdown()
    with pytest.raises(BrokenProcessPool):
        slow.result(20)
    _until(lambda: not _alive(pool._pid) and not any(_alive(w) for w in workers))
    with pytest.raises(BrokenProcessPool):
        pool.submit(max, 1, 2)


def test_a_killed_zygote_fails_the_pending_futures_and_its_workers_end(pool):
    workers = {pool.submit(os.getpid).result(30) for _ in range(4)}
    slow = pool.submit(time.sleep, 30)
    os.kill(pool._pid, signal.SIGKILL)
    with pytest.raises(BrokenProcessPool):
        slow.result(20)
    _until(lambda: not any(_alive(w) for w in workers))
