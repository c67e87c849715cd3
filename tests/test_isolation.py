"""Isolation and the watchdog: a test that aborts, segfaults or hangs fails alone."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

# Thirteen tests: one aborts (as Metal does, pytorch#197796), one dies on
# SIGSEGV, one hangs in a C call that never returns after a device op (a
# pthread mutex locked twice: glibc waits in the kernel again after every
# signal, as a Metal synchronisation that never completes would), ten pass.
CRASHING_SUITE = """
import ctypes
import os

import pytest
import torch


def test_abort(device):
    x = torch.ones(3, device=device) + 1
    os.abort()


def test_segv(device):
    y = torch.zeros(2, device=device) * 3
    ctypes.string_at(0)


def test_hang(device):
    z = torch.ones(2, device=device).sum()
    lock = ctypes.create_string_buffer(64)
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(lock)
    libc.pthread_mutex_lock(lock)


@pytest.mark.parametrize("i", range(10))
def test_ok(device, i):
    assert (torch.ones(2, device=device) * i).sum().item() == 2 * i
"""


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="cpu-serial-forkserver"),
        pytest.param(["--mps-emulate", "-n", "2"], id="emulated-xdist-forkserver"),
        pytest.param(["--mps-isolate-start=fork", "-n", "2"], id="cpu-xdist-fork"),
    ],
)
def test_crashes_and_hangs_fail_alone_and_the_session_finishes(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makepyfile(test_crashing=CRASHING_SUITE)
    result = pytester.runpytest_subprocess(
        "--mps-isolate", "--mps-timeout=4", "--junitxml=junit.xml", *args, timeout=120
    )
    result.assert_outcomes(failed=3, passed=10)
    result.stdout.fnmatch_lines_random(
        [
            "pytest-mps isolation: every test in a child process (*); a limit of "
            "4 s (--mps-timeout=4) per test",
            "SIGABRT (signal 6, exit status 134 in a shell): the test's child process*",
            "last device op it started: torch.Tensor.add at test_crashing.py:9",
            "its code when it died: test_crashing.py:10 in test_abort",
            "SIGSEGV (signal 11, *",
            "last device op it started: torch.Tensor.mul at test_crashing.py:14",
            "its code when it died: test_crashing.py:15 in test_segv",
            "Timeout: the test ran past its limit of 4 s (--mps-timeout=4)*killed*",
            "device op in flight (or the last it started): torch.Tensor.sum at "
            "test_crashing.py:19",
            "its code at the limit: test_crashing.py:23 in test_hang",
            "FAILED test_crashing.py::test_abort* - Failed: SIGABRT*",
        ]
    )
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    failed = sorted(c.get("name", "") for c in cases if c.find("failure") is not None)
    assert [name.split("[")[0] for name in failed] == [
        "test_abort",
        "test_hang",
        "test_segv",
    ]


def test_only_marked_tests_are_isolated_and_fixtures_stay_consistent(
    pytester: pytest.Pytester,
) -> None:
    # the parent's module fixture of test_a must be torn down before test_c's
    # module, although test_b ran in a child in between
    pytester.makepyfile(
        test_a="""
        import os
        import pytest

        @pytest.fixture(scope="module")
        def resource():
            yield os.getpid()
            print("TORN DOWN A")

        def test_a(resource):
            assert resource == os.getpid()
        """,
        test_b="""
        import os
        import pytest

        PARENT = os.getppid()

        @pytest.mark.mps_isolate
        def test_b_in_child():
            os.kill(os.getpid(), 9)

        def test_b_here():
            pass
        """,
        test_c="""
        import os
        def test_c():
            pass
        """,
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=3)
    result.stdout.fnmatch_lines(
        ["*TORN DOWN A*", "SIGKILL (signal 9, *", "it started no device op"]
    )


def test_a_marker_limit_overrides_the_session_limit_in_the_main_process_too(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import time
        import pytest

        @pytest.mark.mps_isolate
        @pytest.mark.mps_timeout(1)
        def test_sleeps():
            time.sleep(60)

        def test_fast():
            pass
        """
    )
    result = pytester.runpytest_subprocess("--mps-timeout=50", timeout=60)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "Timeout: the test ran past its limit of 1 s (mps_timeout(1) marker)*",
            "its code at the limit: test_a_marker_limit*.py:7 in test_sleeps",
        ]
    )


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (
            ["--mps-timeout=-2"],
            "",
            "ERROR: --mps-timeout: '-2' is not a time limit; give a positive number*",
        ),
        (
            ["--mps-timeout=soon"],
            "",
            "ERROR: --mps-timeout: 'soon' is not a time limit*",
        ),
        (
            [],
            "mps_timeout = 0",
            "ERROR: mps_timeout in *tox.ini: '0' is not a time limit*",
        ),
        (
            ["--mps-isolate-start=forkservr"],
            "",
            "ERROR: --mps-isolate-start: 'forkservr' is not a start method; "
            "did you mean*",
        ),
    ],
)
def test_a_bad_limit_or_start_method_is_one_line_naming_where(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_it(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_bad_marker_limit_names_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps_timeout("later")
        def test_it():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.mps_timeout('later') on test_a_bad_marker*::test_it: "
            "'later' is not a time limit*"
        ]
    )


def test_the_markers_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.mps_isolate: run this test in a child process*",
            "@pytest.mark.mps_timeout(seconds): fail this test past*",
        ]
    )


def test_a_hang_in_the_main_process_stops_the_session_with_its_reports_written(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_crashing=CRASHING_SUITE)
    result = pytester.runpytest_subprocess(
        "--mps-timeout=3", "--junitxml=junit.xml", "-k", "ok or hang", timeout=60
    )
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "Timeout: the test ran past its limit of 3 s (--mps-timeout=3) in the "
            "main process; the session stops here, with its reports written*",
            "device op in flight (or the last it started): torch.Tensor.sum at "
            "test_crashing.py:19",
            "its code at the limit: test_crashing.py:23 in test_hang",
            "*test_crashing.py::test_hang*ran past its limit*",
            "*1 failed, 2 deselected*",
        ]
    )
    root = ET.parse(pytester.path / "junit.xml").getroot()
    assert (root[0].get("failures"), root[0].get("tests")) == ("1", "1")


def test_an_abort_without_isolation_is_reported_with_the_test_that_ran(
    pytester: pytest.Pytester,
) -> None:
    # The process dies, and nothing in it runs after SIGABRT but faulthandler's
    # C handler: the sidecar names the test, faulthandler the signal and stack.
    pytester.makepyfile(test_crashing=CRASHING_SUITE)
    result = pytester.runpytest_subprocess(
        "--mps-timeout=60", "-k", "abort or ok", timeout=60
    )
    assert result.ret == -6
    result.stderr.fnmatch_lines(
        [
            "pytest-mps: the pytest process died while running "
            "test_crashing.py::test_abort[[]cpu[]]",
            "Fatal Python error: Aborted",
            '*File "*test_crashing.py", line 10 in test_abort',
        ]
    )


def test_a_session_that_ends_normally_leaves_the_sidecar_silent(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_crashing=CRASHING_SUITE)
    result = pytester.runpytest_subprocess("--mps-timeout=60", "-k", "ok", timeout=60)
    result.assert_outcomes(passed=10, deselected=3)
    assert "pytest-mps: the pytest process died" not in result.stderr.str()


def test_a_spawned_child_collects_only_its_test_and_reports_its_death(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_spawned="""
        import os
        import pytest

        @pytest.mark.mps_isolate
        def test_exits():
            os._exit(3)

        @pytest.mark.mps_isolate
        def test_in_a_new_process():
            # started by the pytest process itself, not forked from a server
            assert os.getpid() != int(os.environ["PARENT_PID"])
            assert os.getppid() == int(os.environ["PARENT_PID"])

        def test_here():
            assert os.getpid() == int(os.environ["PARENT_PID"])
        """,
        conftest="""
        import os

        def pytest_configure(config):
            os.environ.setdefault("PARENT_PID", str(os.getpid()))
        """,
    )
    result = pytester.runpytest_subprocess("--mps-isolate-start=spawn", timeout=120)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        ["exit code 3: the test's child process (spawn) died", "*1 failed, 2 passed*"]
    )


CUDA_AFTER_THE_PARENT = """
import pytest
import torch


def test_in_the_parent(device):
    assert torch.ones(1, device=device).item() == 1


@pytest.mark.mps_isolate
@pytest.mark.parametrize("i", range(2))
def test_isolated(device, i):
    assert torch.full((2,), float(i), device=device).sum().item() == 2 * i
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fork_server_children_use_cuda_after_the_parent_did(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_cuda=CUDA_AFTER_THE_PARENT)
    served = pytester.runpytest_subprocess("--device=cuda", timeout=120)
    served.assert_outcomes(passed=3)
    # forked from the pytest process, which asked the driver: refused, and said why
    forked = pytester.runpytest_subprocess(
        "--device=cuda", "--mps-isolate-start=fork", timeout=120
    )
    forked.assert_outcomes(passed=1, failed=2)
    forked.stdout.fnmatch_lines(
        [
            "Cannot re-initialize CUDA in forked subprocess: the pytest process had "
            "asked the CUDA driver*--mps-isolate-start=forkserver forks from a "
            "process that has not"
        ]
    )


def test_an_isolated_skip_and_xfail_read_as_pytest_makes_them(
    pytester: pytest.Pytester,
) -> None:
    # the reports travel as JSON: a skip's (path, line, reason) must be a tuple
    # again for pytest's summary of skips
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.mps_isolate

        def test_skips():
            pytest.skip("not here")

        @pytest.mark.xfail(reason="known", strict=True)
        def test_fails():
            assert False

        @pytest.mark.parametrize("x", [1])
        def test_records(record_property, x):
            record_property("x", x)
        """
    )
    result = pytester.runpytest_subprocess("-rsx", "--junitxml=junit.xml")
    result.assert_outcomes(skipped=1, xfailed=1, passed=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] test_an_isolated_skip*.py:6: not here", "XFAIL *known*"]
    )
    junit = (pytester.path / "junit.xml").read_text()
    assert '<property name="x" value="1"' in junit


# A Mac through the MPS shim, loaded with -p in the pytest process and in the
# fork server alike (the server parses the same command line). PyTorch's
# torch._C._mps_is_available() registers a fork handler that marks every
# child forked afterwards as in a bad fork (torch/csrc/mps/Module.cpp:
# MPSModule_isAvailable calls track_bad_mps_fork, whose pthread_atfork child
# handler sets in_bad_fork, read by torch.mps._is_in_bad_fork()); the fake
# does the same. Each Metal call (availability, the Metal device's facts, the
# probe's op) is recorded with the role of the process that made it.
FAKE_MAC = """
import json
import time
import os

import torch

from pytest_mps import backend, mac_facts
from pytest_mps.isolation import server
from pytest_mps.machine import probe as probing

BORN = os.getpid()
bad_fork = [False]
tracked = [False]


def role():
    if not server.serving[0]:
        return "pytest"
    return "server" if os.getpid() == BORN else "child"


def note(call):
    with open(os.environ["FAKE_MAC_LOG"], "a") as log:
        log.write(json.dumps([role(), call]) + "\\n")


def is_available():
    note("torch._C._mps_is_available")
    if not tracked[0]:
        tracked[0] = True
        os.register_at_fork(after_in_child=lambda: bad_fork.__setitem__(0, True))
    return True


def metal_device():
    note("MTLCreateSystemDefaultDevice")
    return {"gpu": "Apple M4", "working_set": 12 << 30, "max_buffer": 9 << 30}


real_probe = probing._in_child


def probe(device, timeout):  # the probe's op on the device, in a child
    note("probe")
    return real_probe(device, timeout)


torch.backends.mps.is_built = lambda: True
getattr(torch.backends.mps.is_available, "cache_clear", lambda: None)()
torch._C._mps_is_available = is_available
torch.mps._is_in_bad_fork = lambda: bad_fork[0]
backend.on_macos = lambda: True
mac_facts.metal_device = metal_device
probing._in_child = probe
os.register_at_fork(before=lambda: note("fork"))
"""

ASKS_IN_THE_CHILD = """
import pytest
import torch


@pytest.mark.parametrize("i", range(3))
def test_isolated(device, i):
    assert device.type == "mps"
    assert torch.backends.mps.is_available()
"""


def _calls(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [tuple(json.loads(line)) for line in lines]  # type: ignore[misc]


@pytest.mark.parametrize("start", ["forkserver", "fork"])
def test_the_fork_server_touches_no_metal_and_a_bad_fork_fails_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    pytester.makepyfile(fakemac=FAKE_MAC, test_asks=ASKS_IN_THE_CHILD)
    log = pytester.path / "calls.jsonl"
    monkeypatch.setenv("FAKE_MAC_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    result = pytester.runpytest_subprocess(
        "-p", "fakemac", "--mps", "--mps-isolate", f"--mps-isolate-start={start}",
        "--mps-empty-cache=never",
        timeout=120,
    )  # fmt: skip
    calls = _calls(log)
    pytest_calls = {call for role, call in calls if role == "pytest"}
    # the pytest process asks (the header, --mps, the probe): so it may
    assert {"torch._C._mps_is_available", "probe"} <= pytest_calls
    assert "MTLCreateSystemDefaultDevice" in pytest_calls
    if start == "fork":
        # forked from the pytest process, which had asked: PyTorch's bad fork,
        # and the test's setup does not start
        result.assert_outcomes(errors=3)
        result.stdout.fnmatch_lines(
            ["*Metal cannot be used in this child process: it was forked from a "
             "process that had started MPS (torch.mps._is_in_bad_fork() is True)*"]
        )  # fmt: skip
        return
    result.assert_outcomes(passed=3)
    server = [call for role, call in calls if role == "server"]
    # the server forked the three children and made no Metal call, before or after
    assert server == ["fork"] * 3
    # each child asks the device for itself, in a good fork
    children = [call for role, call in calls if role == "child"]
    assert children.count("torch._C._mps_is_available") == 3


@pytest.mark.parametrize(
    "hang",
    [
        # a plugin's (here a conftest's) unconfigure that never returns
        "def pytest_unconfigure(config):\n    time.sleep(600)\n",
        # an atexit handler that waits on a queue that never signals
        "atexit.register(lambda: threading.Event().wait())\n",
        # a non-daemon thread that never ends: the interpreter waits at exit
        "def pytest_sessionfinish(session):\n"
        "    threading.Thread(target=threading.Event().wait).start()\n",
    ],
    ids=["unconfigure", "atexit", "thread"],
)
def test_a_hang_after_the_last_test_ends_within_the_limit_with_results_written(
    pytester: pytest.Pytester, hang: str
) -> None:
    pytester.makeconftest("import atexit\nimport threading\nimport time\n\n" + hang)
    pytester.makepyfile("def test_ok():\n    assert True\n")
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        "--mps-timeout=3", "--junitxml=junit.xml", timeout=120
    )
    took = time.monotonic() - started
    # the limit, with a floor of 20 s for the summary and other plugins' reports
    assert took < 3 + 30, f"the process took {took:.0f} s"
    assert result.ret == 0  # the session's own status: its one test passed
    result.stdout.fnmatch_lines(["*1 passed*"])
    result.stderr.fnmatch_lines(
        [
            "pytest-mps isolation: the process did not end within 20 s of the "
            "session's end (--mps-timeout=3): a hang after the last test*",
        ]
    )
    cases = list(ET.parse(pytester.path / "junit.xml").getroot().iter("testcase"))
    assert [c.get("name") for c in cases] == ["test_ok"]


def test_a_session_that_ends_on_time_is_not_held_or_cut(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_ok():\n    assert True\n")
    result = pytester.runpytest_subprocess("--mps-timeout=3", timeout=60)
    assert result.ret == 0
    result.stderr.no_fnmatch_line("*did not end within*")
