"""The GPU test command within a deadline, resumable: for machines that stop a command after
a fixed time (the device tool's 10 minutes), where a killed pytest would leave no record.

    python tests/gpu_suite.py --out DIR [--deadline 540] [--ids FILE] [-- PYTEST ARGS...]

Runs `pytest -v -m "(slow or not slow) and not multi_gpu"` over every GPU of the host
(SPIKEFUSE_TEST_GPUS, 14 workers per GPU by default), on the tests in FILE (one node id a line)
or the whole suite, and interrupts it (SIGINT) at the deadline, so that pytest still writes
its summary (SPIKEFUSE_TEST_SUMMARY) and JUnit XML. Then DIR holds summary.json, junit.xml,
log.txt and not-reached.txt: the collected ids that have no result, to pass as --ids to the
next call. Ids of a module skipped at import (a missing optional package) are never listed:
pytest refuses such an id given by name ("found no collectors").
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

SELECTION = ["-m", "(slow or not slow) and not multi_gpu"]


def gpu_count() -> int:
    """The host's GPUs, asked in a child so this process never starts CUDA."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def collected(targets: list[str], extra: list[str]) -> list[str]:
    """The node ids pytest would run (one process, collection only)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *SELECTION, *extra, *targets], capture_output=True, text=True)
    if out.returncode not in (0, 5):  # e.g. an id of a module skipped at import: "found no collectors"
        sys.exit(f"gpu_suite: collecting the tests failed (pytest exit {out.returncode}):\n{out.stdout[-2000:]}")
    return [line for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def junit_key(nodeid: str) -> tuple[str, str]:
    """The (classname, name) pytest's JUnit XML gives the test `nodeid`."""
    path, *scopes, name = nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *scopes]), name


def reported(junit: Path) -> set[tuple[str, str]]:
    """(classname, name) of every test with a result in pytest's JUnit XML."""
    if not junit.exists():
        return set()
    return {(case.get("classname", ""), case.get("name", "")) for case in ElementTree.parse(junit).getroot().iter("testcase")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the records")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds before pytest is interrupted")
    parser.add_argument("--ids", type=Path, help="a file of node ids to run (default: the whole suite)")
    parser.add_argument("--workers-per-gpu", type=int, default=14)
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = [line for line in args.ids.read_text().splitlines() if line.strip()] if args.ids else ["tests"]
    wanted = collected(targets, extra)  # first: a bad id list fails here in seconds
    gpus = gpu_count()
    env = dict(os.environ, SPIKEFUSE_TEST_SUMMARY=str(args.out / "summary.json"))
    if gpus:
        env["SPIKEFUSE_TEST_GPUS"] = ",".join(map(str, range(gpus)))
    workers = max(gpus, 1) * args.workers_per_gpu
    junit = args.out / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:cacheprovider", *SELECTION,
               "-n", str(workers), "--dist", "load" if args.ids else "loadfile", f"--junitxml={junit}", *extra, *targets]
    with open(args.out / "log.txt", "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            child.wait(timeout=max(args.deadline - (time.monotonic() - started), 1.0))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)  # pytest stops, then writes its summary and XML
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    done = reported(junit)
    rest = [i for i in wanted if junit_key(i) not in done]
    (args.out / "not-reached.txt").write_text("".join(f"{i}\n" for i in rest))
    print(f"gpu_suite: pytest exit {child.returncode}, {len(done)} tests with a result, {len(rest)} not reached "
          f"({time.monotonic() - started:.0f} s); records in {args.out}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
