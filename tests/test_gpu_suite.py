"""tests/gpu_suite.py's bookkeeping: which collected ids an interrupted run left without a
result, from pytest's JUnit XML (the run itself needs minutes; it ran on the GPU hosts)."""
import subprocess
import sys
import time

import gpu_suite


def test_not_reached_ids_come_from_the_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.test_a" name="test_x[1-a b]" time="0.1"/>'
                     '<testcase classname="tests.test_b.TestCase" name="test_y" time="0.1"><failure/></testcase>'
                     '<testcase time="0.002"/>'  # pytest's record of the test in flight at the interrupt
                     '</testsuite></testsuites>')
    done = gpu_suite.reported(junit)
    ids = ["tests/test_a.py::test_x[1-a b]", "tests/test_b.py::TestCase::test_y", "tests/test_a.py::test_z"]
    assert [i for i in ids if gpu_suite.junit_key(i) not in done] == ["tests/test_a.py::test_z"]
    assert gpu_suite.reported(tmp_path / "missing.xml") == set()  # pytest killed before writing: nothing done


def test_outcomes_come_from_the_verbose_log_where_no_xml_was_written(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("tests/test_a.py::test_x[1] \n"  # -n 0: the id, then the outcome on a later write
                   "[gw8] [ 96%] FAILED tests/test_a.py::test_x[2-a b] \n"
                   "[gw1] [ 10%] PASSED tests/test_b.py::TestCase::test_y \n"
                   "[gw2] [ 11%] SKIPPED tests/test_b.py::test_z \n"
                   "tests/test_c.py::test_w[mlp] PASSED                      [ 10%]\n"
                   "FAILED tests/test_a.py::test_x[2-a b] - AssertionError: spikes differ\n")
    assert gpu_suite.outcomes_in_log(log) == {"tests/test_a.py::test_x[2-a b]": "FAILED",
                                              "tests/test_b.py::TestCase::test_y": "PASSED",
                                              "tests/test_b.py::test_z": "SKIPPED",
                                              "tests/test_c.py::test_w[mlp]": "PASSED"}
    assert gpu_suite.outcomes_in_log(tmp_path / "missing.txt") == {}


def hung_after(tmp_path, lines: str):
    """A child that writes `lines` as its -v log, then hangs (as a worker's teardown did)."""
    log = tmp_path / "log.txt"
    script = f"open({str(log)!r}, 'w').write({lines!r}); import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", script]), log


def test_pytest_still_running_after_every_test_reported_is_interrupted_after_the_grace(tmp_path):
    child, log = hung_after(tmp_path, "[gw0] [ 50%] PASSED tests/a.py::x \n[gw1] [100%] PASSED tests/a.py::y \n")
    try:
        start = time.monotonic()
        assert not gpu_suite.run_until_done(child, log, {"tests/a.py::x", "tests/a.py::y"}, start + 50, grace=0.5,
                                            poll=0.1)
        assert time.monotonic() - start < 20  # long before the deadline
    finally:
        child.kill()
        child.wait()


def test_a_run_with_tests_left_waits_for_its_deadline_and_an_exit_is_done(tmp_path):
    child, log = hung_after(tmp_path, "[gw0] [ 50%] PASSED tests/a.py::x \n")
    try:
        start = time.monotonic()
        assert not gpu_suite.run_until_done(child, log, {"tests/a.py::x", "tests/a.py::y"}, start + 1.5, grace=0.1,
                                            poll=0.1)
        assert time.monotonic() - start >= 1.4
    finally:
        child.kill()
        child.wait()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gpu_suite.run_until_done(done, log, {"tests/a.py::y"}, time.monotonic() + 50, poll=0.1)
