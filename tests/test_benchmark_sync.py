"""The sync is real: asynchronous work is timed at its real duration.

A fake device queue (a background thread that runs the "kernels") stands in
for a GPU: the benchmarked function only enqueues work and returns at once, as
a CUDA or MPS launch does. Draining the queue is the sync. An unsynced timer
reads the enqueue cost; ours reads what the work took.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from pytest_mps.benchmark.records import Settings
from pytest_mps.benchmark.timer import Probe, measure

KERNEL = 0.01  # seconds each fake kernel runs on the fake device
# The control launches one long kernel, so that "the launch returned before
# the work was done" holds by a wide margin even on a loaded CI machine (a
# 2 ms kernel once took 2.4 ms to enqueue there, under contention for the GIL).
LONG = 0.3

FAKE_DEVICE = '''
import queue
import threading
import time


class FakeDevice:
    """A device queue: a worker thread runs each queued kernel in order."""

    def __init__(self):
        self.jobs = queue.Queue()
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self):
        while True:
            seconds = self.jobs.get()
            time.sleep(seconds)
            self.jobs.task_done()

    def launch(self, seconds):
        self.jobs.put(seconds)

    def synchronize(self):
        self.jobs.join()


DEVICE = FakeDevice()
'''


def fake_device() -> object:
    namespace: dict[str, object] = {}
    exec(FAKE_DEVICE, namespace)
    return namespace["DEVICE"]


def test_synced_timer_reads_the_real_duration_and_unsynced_reads_less() -> None:
    device: object = fake_device()

    def launch() -> None:
        device.launch(KERNEL)  # type: ignore[attr-defined]

    probe = Probe(synchronize=device.synchronize, asynchronous=True)  # type: ignore[attr-defined]
    result, _ = measure(launch, probe=probe, settings=Settings(max_time=0.1))
    assert result.stats.median >= KERNEL * 0.95
    # What pytest-benchmark (no sync) would read: the cost of enqueueing.
    t0 = time.perf_counter()
    device.launch(LONG)  # type: ignore[attr-defined]
    unsynced = time.perf_counter() - t0
    pending = device.jobs.unfinished_tasks  # type: ignore[attr-defined]
    device.synchronize()  # type: ignore[attr-defined]
    assert pending == 1
    assert unsynced < LONG / 4
    assert result.dispatch.median < result.stats.median / 4
    assert result.verdict == "device-bound"


def test_without_the_sync_the_same_timer_would_read_the_enqueue_cost() -> None:
    # The control: the same measurement with a no-op sync reads far less, so
    # the sync (not something else in the timer) is what gives the real time.
    jobs: queue.Queue[float] = queue.Queue()

    def work() -> None:
        while True:
            time.sleep(jobs.get())

    threading.Thread(target=work, daemon=True).start()
    result, _ = measure(
        jobs.put, (KERNEL / 10,), settings=Settings(rounds=20, iterations=1, warmup=0)
    )
    assert result.stats.median < KERNEL / 40


CONFTEST = (
    FAKE_DEVICE
    + """

def pytest_mps_synchronize(device):
    DEVICE.synchronize()
    return True
"""
)

TEST_FILE = """
import time

import pytest
from conftest import DEVICE

KERNEL = 0.01
LONG = 0.3


@pytest.mark.mps_benchmark(max_time=0.1)
def test_timed(mps_benchmark):
    mps_benchmark(DEVICE.launch, KERNEL)
    t0 = time.perf_counter()
    DEVICE.launch(LONG)
    unsynced = time.perf_counter() - t0
    pending = DEVICE.jobs.unfinished_tasks
    DEVICE.synchronize()
    print(f"\\nSTATS median={mps_benchmark.stats.median} unsynced={unsynced}")
    assert pending == 1
    assert unsynced < LONG / 4
    assert mps_benchmark.stats.median >= KERNEL * 0.95
    assert mps_benchmark.result.verdict == "device-bound"
"""


def test_a_conftest_sync_hook_makes_the_fixture_wait_for_its_queue(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TEST_FILE)
    result = pytester.runpytest(
        "-s", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*measured on cpu*", "*test_timed*device-bound*"])


def test_without_the_hook_the_fixture_reads_only_the_enqueue_cost(
    pytester: pytest.Pytester,
) -> None:
    # The same queue, but the conftest does not plug it in: nothing waits.
    pytester.makeconftest(FAKE_DEVICE)
    pytester.makepyfile(
        """
        from conftest import DEVICE

        def test_timed(mps_benchmark):
            mps_benchmark.pedantic(DEVICE.launch, (0.02,), rounds=20)
            pending = DEVICE.jobs.unfinished_tasks
            DEVICE.synchronize()
            # The fixture returned with kernels still queued, having read
            # only what each launch took to enqueue.
            assert pending > 0
            assert mps_benchmark.stats.median < 0.02 / 4
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)
