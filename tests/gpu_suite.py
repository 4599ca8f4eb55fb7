"""The GPU test command within a deadline, resumable: for machines that stop a command after
a fixed time (the device tool's 10 minutes), where a killed pytest would leave no record.

    python tests/gpu_suite.py --out DIR [--deadline 540] [--ids FILE] [-- PYTEST ARGS...]

Runs `pytest -v -m "(slow or not slow) and not multi_gpu"` over every GPU of the host
(SPIKEFUSE_TEST_GPUS, 14 workers per GPU by default), on the tests in FILE (one node id a line)
or the whole suite, and interrupts it (SIGINT) at the deadline, or 30 s after every test has
an outcome in the log while pytest still runs, so that pytest still writes its summary
(SPIKEFUSE_TEST_SUMMARY) and JUnit XML. Then DIR holds summary.json, junit.xml,
log.txt and not-reached.txt: the collected ids that have no result (in the XML or in the -v
log, which stands in where pytest wrote no XML), to pass as --ids to the next call. Ids of a
module skipped at import (a missing optional package) are never listed: pytest refuses such
an id given by name ("found no collectors").
"""
from __future__ import annotations

import argparse
import os
import re
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


OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
# "[gw3] [ 41%] PASSED id" (workers), "id PASSED  [ 41%]" (one process), or the short summary's "FAILED id - message"
_OUTCOME = "(?P<outcome>" + "|".join(OUTCOMES) + ")"
RESULT_LINES = (re.compile(r"^(?:\[gw\d+\] \[ *\d+%\] )?" + _OUTCOME + r" (?P<nodeid>.+?)(?: - .*)?\s*$"),
                re.compile(r"^(?P<nodeid>\S.*?) " + _OUTCOME + r"\s+\[ *\d+%\]\s*$"))


def outcomes_in_log(log: Path) -> dict[str, str]:
    """node id -> outcome, from pytest -v's lines ("[gw3] [ 41%] PASSED tests/x.py::test_y", or
    "tests/x.py::test_y PASSED  [ 41%]" without workers):
    the record when pytest never wrote its XML (a worker that hangs at teardown after the last
    test keeps xdist waiting until the interrupt, which then lands inside the session's end)."""
    found = {}
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            match = RESULT_LINES[0].match(line) or RESULT_LINES[1].match(line)
            if match and "::" in match["nodeid"]:
                found[match["nodeid"]] = match["outcome"]
    return found


def run_until_done(child, log: Path, tests: set[str], deadline: float, grace: float = 30.0, poll: float = 5.0) -> bool:
    """Wait for pytest; True once it exited. False at the deadline, or `grace` seconds after the
    -v log holds an outcome for each node id in `tests` while pytest still runs (an xdist worker
    hung at teardown held a 620-test call until its deadline): then the caller interrupts it."""
    all_reported = None
    while child.poll() is None:
        now = time.monotonic()
        if now >= deadline or (all_reported is not None and now - all_reported >= grace):
            return False
        if all_reported is None and tests <= outcomes_in_log(log).keys():
            all_reported = now
        time.sleep(min(poll, max(deadline - now, 0.0)))
    return True


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
        if not run_until_done(child, args.out / "log.txt", set(wanted), started + args.deadline):
            child.send_signal(signal.SIGINT)  # pytest stops, then writes its summary and XML
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    done = reported(junit)
    logged = outcomes_in_log(args.out / "log.txt")
    done |= {junit_key(i) for i in logged}
    rest = [i for i in wanted if junit_key(i) not in done]
    (args.out / "not-reached.txt").write_text("".join(f"{i}\n" for i in rest))
    counts = {o: sum(v == o for v in logged.values()) for o in OUTCOMES if o in logged.values()}
    print(f"gpu_suite: pytest exit {child.returncode}, {len(done)} tests with a result, {len(rest)} not reached "
          f"({time.monotonic() - started:.0f} s); in the log: {counts}; records in {args.out}"
          + ("" if junit.exists() else " (no JUnit XML: the log's outcomes stand for it)"))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
