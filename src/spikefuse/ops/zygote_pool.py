"""A process pool whose workers are forked by one forked process (the zygote), not by the caller.

Each fork copies the forking process's page tables: from a trainer with torch and a CUDA context,
forking the 8 compile processes took 0.13 s of the training thread at a cold fit's start (4x H100,
benchmarks/results/runs-2026-11-27-s18/). Here the training thread forks once; the zygote, which
runs no thread of the trainer's, forks the workers while training goes on. Requests and results
travel over one pipe, and a thread of the caller's resolves the futures.

    pool = ZygotePool(8, setup, setup_args, worker_setup)
    future = pool.submit(function, *args)   # concurrent.futures.Future; arguments are pickled at once
    pool.shutdown()                          # pending futures fail with BrokenProcessPool

`setup(*setup_args)` runs in the zygote before it forks the workers (they inherit what it set up);
`worker_setup(zygote_pid)` runs first in each worker. Where the zygote or a worker dies, the futures
concerned fail (BrokenProcessPool), as in concurrent.futures.ProcessPoolExecutor.
"""
from __future__ import annotations

import concurrent.futures
import functools
import itertools
import multiprocessing
import os
import threading
import warnings
from concurrent.futures.process import BrokenProcessPool

__all__ = ["ZygotePool"]


class ZygotePool:
    def __init__(self, workers: int, setup, setup_args: tuple, worker_setup):
        here, there = multiprocessing.Pipe()
        with warnings.catch_warnings():  # "use of fork() may lead to deadlocks in the child": the
            warnings.simplefilter("ignore", DeprecationWarning)  # zygote runs none of our threads' work
            pid = os.fork()
        if pid == 0:  # the zygote: it never returns into the caller's code
            code = 1
            try:
                here.close()
                _zygote(there, workers, setup, setup_args, worker_setup)
                code = 0
            finally:
                os._exit(code)
        there.close()
        self._pid, self._conn = pid, here
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._broken: str | None = None
        threading.Thread(target=self._read_results, name="spikefuse-compile-results", daemon=True).start()

    def submit(self, function, *args) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        with self._lock:
            if self._broken is not None:
                raise BrokenProcessPool(self._broken)
            key = next(self._keys)
            self._conn.send((key, function, args))  # pickled whole first: a failure sends nothing
            self._futures[key] = future
        return future

    def shutdown(self) -> None:
        """End the zygote and its workers, without waiting; pending futures fail (work in flight
        is dropped)."""
        with self._lock:
            if self._broken is None:
                try:
                    self._conn.send(None)
                except OSError:  # it ended already
                    pass

    def _read_results(self) -> None:
        try:
            while True:
                key, ok, value = self._conn.recv()
                with self._lock:
                    future = self._futures.pop(key, None)
                if future is None:
                    continue
                if ok:
                    future.set_result(value)
                else:  # the call raised, or its worker died: the caller falls back (compiles in a thread)
                    future.set_exception(BrokenProcessPool(value))
        except (EOFError, OSError):  # the zygote ended (shut down, or died)
            pass
        with self._lock:
            self._broken, pending, self._futures = "the compile processes ended", self._futures, {}
        for future in pending.values():
            future.set_exception(BrokenProcessPool(self._broken))
        self._conn.close()
        try:
            os.waitpid(self._pid, 0)  # no zombie left behind
        except ChildProcessError:
            pass


def _zygote(conn, workers: int, setup, setup_args: tuple, worker_setup) -> None:
    setup(*setup_args)
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("fork"),
        initializer=_worker_start, initargs=(worker_setup, os.getpid(), conn.fileno()))
    pool.submit(os.getpid)  # with "fork", the first submit forks every worker, before any thread starts
    sending = threading.Lock()

    def reply(key, future):
        try:
            message = (key, True, future.result())
        except BaseException as e:  # noqa: BLE001  (a failed call, a worker that died)
            message = (key, False, f"{type(e).__name__}: {e}")
        with sending:
            try:
                conn.send(message)
            except OSError:  # the caller is gone
                pass
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        key, function, args = message
        try:
            pool.submit(function, *args).add_done_callback(functools.partial(reply, key))
        except Exception as e:  # noqa: BLE001  (the pool broke: a worker died)
            failed = concurrent.futures.Future()
            failed.set_exception(e)
            reply(key, failed)
    pool.shutdown(wait=False, cancel_futures=True)  # the workers end with us (worker_setup's business)


def _worker_start(worker_setup, zygote: int, pipe_fd: int) -> None:
    os.close(pipe_fd)  # the zygote's end of the caller's pipe: the caller sees its end when the zygote ends
    worker_setup(zygote)
