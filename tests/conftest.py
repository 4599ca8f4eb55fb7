"""Where the tests run, chosen once for the whole run, before anything imports triton:

  - a machine with a CUDA GPU: the kernel tests run compiled on it (TRITON_INTERPRET is left
    alone), and the `gpu` / `multi_gpu` tests run;
  - a CPU-only machine: the fused kernels run on CPU tensors through Triton's interpreter
    (TRITON_INTERPRET=1 is set here unless the environment sets it); `gpu` tests are skipped.

SPIKEFUSE_TEST_DEVICE=cpu|cuda overrides the choice (cpu on a GPU machine: the interpreter run).
Tests that need the CPU whatever the device (the gloo process tests) pin it themselves;
`interpreter` tests (fused kernels on CPU tensors) run in a child pytest with the
interpreter on where this process compiles the kernels. pyproject's addopts leave the `slow`
tests out and ask pytest-xdist for `-n auto`, which is decided here: a worker per core on
the CPU, none on a GPU machine.
SPIKEFUSE_TEST_SUMMARY=PATH writes a JSON summary of the run there (for GPU machines, whose
logs are not kept); SPIKEFUSE_TEST_COMMIT names the commit where the tree's .git is not its own.
SPIKEFUSE_TEST_GPUS=0,1,2,3 spreads the xdist workers over those GPUs, one each, in turn (a
multi-GPU host runs the one-GPU suite in a quarter of the time; `multi_gpu` tests then skip).
"""
import os

SPREAD_GPUS = [g.strip() for g in os.environ.get("SPIKEFUSE_TEST_GPUS", "").split(",") if g.strip()]
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in an xdist worker, set before conftest loads
PINNED = bool(SPREAD_GPUS and _WORKER)  # this worker sees one GPU of SPREAD_GPUS
if PINNED:
    # before anything asks CUDA: the driver reads CUDA_VISIBLE_DEVICES once, at its first call
    os.environ["CUDA_VISIBLE_DEVICES"] = SPREAD_GPUS[int(_WORKER.removeprefix("gw")) % len(SPREAD_GPUS)]

from helpers import DEVICE, interpreted  # noqa: E402  (first: imports torch, not triton)
from gpu_suite import junit_key  # noqa: E402  (the (classname, name) JUnit XML gives a node id)

if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # an explicit 0 stays (a GPU machine's view of CPU tensors)
if os.environ.get("TRITON_INTERPRET") == "1":
    from triton_interpreter import skip_repeated_language_patches  # noqa: E402
    skip_repeated_language_patches()  # about half of a small kernel's interpreted time
os.environ["SPIKEFUSE_TEST_DEVICE"] = DEVICE  # subprocesses of the tests choose alike
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
# inductor compiles in the test's own process: a compile pool per xdist worker oversubscribes the
# cores, and on a GPU machine a worker hung at exit in the pool's shutdown
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
SUMMARY = os.environ.pop("SPIKEFUSE_TEST_SUMMARY", "")  # popped: a pytest a test starts must not write it

import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from xml.etree import ElementTree  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


if DEVICE == "cpu" and _WORKER:
    # one of N xdist workers, a worker per core: torch's intra-op pool (a thread per core in each
    # worker) would oversubscribe the cores; the subprocesses the tests start inherit this too
    _share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    torch.set_num_threads(_share)
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))


def pytest_configure(config):
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("SPIKEFUSE_TEST_DEVICE=cuda, but torch sees no CUDA GPU here "
                                f"(torch {torch.__version__}); leave it unset to test on the CPU")
    if DEVICE == "cuda" and interpreted():
        # the kernels would run through the interpreter on GPU tensors, which no test expects
        raise pytest.UsageError("TRITON_INTERPRET=1 on a GPU machine: unset it to test the compiled kernels "
                                "on the GPU, or add SPIKEFUSE_TEST_DEVICE=cpu to test them on the CPU "
                                "through the interpreter")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it (-p no:xdist) it goes unused
def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject's addopts): a worker per core on a CPU-only machine (the interpreter
    is one core's work); on a GPU machine none: parallel tests would compete for GPU memory."""
    return 0 if DEVICE == "cuda" else min(os.cpu_count() or 1, 8)


# files whose tests are independent and long (separate training runs, fuzz seeds): under
# --dist loadfile their tests spread over the workers one by one, not as one file's unit
SPREAD_FILES = {"tests/test_cli_matrix.py", "tests/test_fuzz.py", "tests/test_fuzz_properties.py"}
# compiled on a GPU, each fuzz example builds new kernel variants (its constexpr options):
# minutes per test, so they start first and overlap the rest
LONGEST_ON_GPU = {"test_fuzz_properties.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SpreadingLoadFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return nodeid if scope in SPREAD_FILES else scope
    return SpreadingLoadFile(config, log)


def _gpu_skip_reason(gpus_needed: int) -> str | None:
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available == 0:
        return "needs a CUDA GPU; this machine has none"
    if DEVICE != "cuda":
        return "SPIKEFUSE_TEST_DEVICE=cpu: this run tests the CPU; the GPU tests run without it"
    if PINNED and gpus_needed > 1:
        return "SPIKEFUSE_TEST_GPUS gives each worker one GPU; run -m multi_gpu without it"
    if available < gpus_needed:
        return f"needs {gpus_needed} CUDA GPUs; this machine has {available}"
    return None


def pytest_collection_modifyitems(config, items):
    reasons = {"gpu": _gpu_skip_reason(1), "multi_gpu": _gpu_skip_reason(2)}
    for item in items:
        for marker, reason in reasons.items():
            if reason is not None and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
    if DEVICE == "cuda":  # xdist hands out files in this order: longest first, the whole-GPU tests last
        in_child = {i.path for i in items if i.get_closest_marker("interpreter") is not None}
        items.sort(key=lambda i: 3 if i.get_closest_marker("whole_gpu") else 0 if i.path.name in LONGEST_ON_GPU
                   else 1 if i.path in in_child else 2)


# ---- whole_gpu tests (tens of GB) run alone on the GPU: a readers-writer lock between workers ----

@pytest.fixture(autouse=True)
def _gpu_turn(request):
    """Under pytest-xdist on a GPU: every test holds a shared lock, a `whole_gpu` test an
    exclusive one; a waiting whole_gpu test holds the gate, so new tests wait behind it.
    After a test its worker hands its cached GPU memory back for the tests of others."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if DEVICE != "cuda" or not run:
        yield
        return
    import fcntl
    gpu = os.environ["CUDA_VISIBLE_DEVICES"] if PINNED else "all"  # a lock per GPU when spread
    base = Path(tempfile.gettempdir()) / f"spikefuse-tests-{run}-gpu{gpu}"
    whole = request.node.get_closest_marker("whole_gpu") is not None
    with open(f"{base}.gate", "a") as gate, open(f"{base}.room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        if not whole:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


_CHILD_OUTCOMES: dict[str, tuple[str, str]] = {}  # nodeid -> (outcome, message) from a child pytest


def _run_interpreter_tests_in_a_child(item) -> None:
    """Run the selected `interpreter` tests of item's module in one child pytest with the
    interpreter on, and note each one's outcome (one child per module: its start-up is seconds)."""
    ids = [i.nodeid for i in item.session.items
           if i.path == item.path and i.get_closest_marker("interpreter") is not None]
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPIKEFUSE_TEST_DEVICE": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        workers = min(4, len(ids) // 10)  # a long module (test_compile's ~40 tests) is the run's long pole
        spread = ["-n", str(workers), "--dist", "load"] if workers >= 2 else ["-p", "no:xdist"]
        child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                                *spread, f"--junitxml={report}", *ids],  # these tests, whatever addopts selects
                               cwd=item.config.rootpath, env=env, capture_output=True, text=True)
        cases = ElementTree.parse(report).getroot().iter("testcase") if report.exists() else []
        found = {(c.get("classname"), c.get("name")): c for c in cases}
    tail = "\n".join((child.stdout + child.stderr).strip().splitlines()[-30:])
    for nodeid in ids:
        case = found.get(junit_key(nodeid))
        if case is None:
            _CHILD_OUTCOMES[nodeid] = ("failed", f"no result (child pytest exit {child.returncode}):\n{tail}")
            continue
        problem = next((e for e in case if e.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if problem is None else "skipped" if problem.tag == "skipped" else "failed"
        message = "" if problem is None else (problem.get("message") or "") + "\n" + (problem.text or "")
        _CHILD_OUTCOMES[nodeid] = (outcome, message)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """An `interpreter` test (fused kernels on CPU tensors, as on a CPU-only machine) where this
    process compiles its kernels (a GPU machine: Triton decides when a kernel is defined): it
    runs in a child pytest with the interpreter on, and passes, fails or skips as it does there."""
    if pyfuncitem.get_closest_marker("interpreter") is None or interpreted():
        return None
    if pyfuncitem.nodeid not in _CHILD_OUTCOMES:
        _run_interpreter_tests_in_a_child(pyfuncitem)
    outcome, message = _CHILD_OUTCOMES.pop(pyfuncitem.nodeid)
    where = "through Triton's interpreter in a child pytest"
    if outcome == "failed":
        pytest.fail(f"{where}:\n{message.strip()}", pytrace=False)
    if outcome == "skipped":
        pytest.skip(f"{where}: {message.strip()}")
    return True


@pytest.fixture(scope="session")
def device() -> str:
    """"cuda" or "cpu": where the kernel tests put their tensors (see helpers.DEVICE)."""
    return DEVICE


# ---- SPIKEFUSE_TEST_SUMMARY=PATH: a small record of the run ----

_STARTED = time.monotonic()


def _commit(root: Path) -> str:
    if os.environ.get("SPIKEFUSE_TEST_COMMIT"):  # a copy of the tree whose .git is not the tree's own
        return os.environ["SPIKEFUSE_TEST_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _device_name() -> str:
    if DEVICE == "cuda":
        return f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not SUMMARY or hasattr(config, "workerinput"):  # pytest-xdist: the controller writes it
        return
    stats = terminalreporter.stats

    def ids(key):  # a test counts once per outcome, whichever phase reported it
        return sorted({r.nodeid for r in stats.get(key, []) if getattr(r, "nodeid", None) is not None})

    failed = ids("failed")
    errors = ids("error")
    summary = {
        "commit": _commit(config.rootpath),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_name(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "interpreter": interpreted(),
        "selection": " ".join(config.invocation_params.args),
        "gpus_spread": ",".join(SPREAD_GPUS) or None,
        "duration_s": round(time.monotonic() - _STARTED, 1),
        "exit_status": int(exitstatus),
        "passed": len(ids("passed")),
        "failed": len(failed),
        "skipped": len(ids("skipped")),
        "errors": len(errors),
        "failed_ids": failed,
        "error_ids": errors,
    }
    target = Path(SUMMARY)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")  # same file system: atomic rename
    with os.fdopen(fd, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    os.replace(tmp, target)
    terminalreporter.write_line(f"summary written to {target}")
