"""The machine's fingerprint: the header line, the JSON and junit fields, and
benchmark comparisons across two fingerprints.

A Mac is presented through the MPS shim (``backend.mac_facts``), with values
that real machines report:

- the physical Mac of pytorch#189215 (a review thread there prints them):
  ``torch.mps.recommended_max_memory()`` 17.76 GiB, ``maxBufferLength``
  13.32 GiB, the allocator's high-watermark limit 30.19 GiB (1.7 x 17.76);
- GitHub's hosted arm64 runner: its Metal device is "Apple Paravirtual device"
  (pytorch#111576), its chip "Apple M1 (Virtual)" and model "VirtualMac2,1"
  (the runners' published system reports), 7 GB of memory (GitHub's
  announcement, quoted in micro-sam#370), and PyTorch's limit there "max
  allowed: 1.70 GB", 1.7 x a 1 GiB working set (opensoundscape#850).

The macOS builds are real ones (15.5 is 24F74, 26.0 is 25A354); the chip and
frameworks' versions of the physical Mac are examples. Nothing here ran on a Mac.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_mps import backend, mac_facts
from pytest_mps.mac_facts import MacFacts
from pytest_mps.machine import fingerprint

GIB = 1 << 30

PHYSICAL = MacFacts(
    macos="15.5",
    build="24F74",
    model="Mac14,10",
    chip="Apple M2 Pro",
    vmm=False,
    memory=24 * GIB,
    gpu="Apple M2 Pro",
    gpu_cores=19,
    working_set=int(17.760009765625 * GIB),
    max_buffer=int(13.32000732421875 * GIB),
    metal="368.12",
    mpsgraph="5.1.0",
)
PARAVIRTUAL = MacFacts(
    macos="15.5",
    build="24F74",
    model="VirtualMac2,1",
    chip="Apple M1 (Virtual)",
    vmm=True,
    memory=7 * GIB,
    gpu="Apple Paravirtual device",
    gpu_cores=None,
    working_set=1 * GIB,
    max_buffer=None,
    metal=None,
    mpsgraph=None,
)


@pytest.fixture
def physical_mac(monkeypatch: pytest.MonkeyPatch) -> MacFacts:
    monkeypatch.setattr(backend, "mac_facts", lambda: PHYSICAL)
    monkeypatch.delenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", raising=False)
    return PHYSICAL


@pytest.fixture
def hosted_runner(monkeypatch: pytest.MonkeyPatch) -> MacFacts:
    monkeypatch.setattr(backend, "mac_facts", lambda: PARAVIRTUAL)
    monkeypatch.delenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", raising=False)
    return PARAVIRTUAL


def test_the_header_names_this_linux_machine_and_torchs_build(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_ok(device): pass")
    result = pytester.runpytest("--mps-device=cpu")
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    result.stdout.fnmatch_lines(
        [f"pytest-mps machine: Linux *, x86_64, *; torch build: {build}, git *"]
    )


def test_a_guest_run_reads_no_machine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--junitxml=junit.xml")
    result.stdout.no_fnmatch_line("*pytest-mps machine*")
    assert "pytest_mps.machine" not in (pytester.path / "junit.xml").read_text()


def test_the_header_names_a_macs_build_chip_gpu_and_memory_limits(
    pytester: pytest.Pytester, physical_mac: MacFacts
) -> None:
    pytester.makepyfile("def test_ok(device): pass")
    result = pytester.runpytest("--mps-device=cpu")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps machine: macOS 15.5 (24F74), *, Apple M2 Pro (Mac14,10), "
            "GPU Apple M2 Pro, 19 cores, Metal 368.12, MPSGraph 5.1.0; "
            "MPS memory: working set 17.76 GiB, high watermark 30.19 GiB, "
            "largest buffer 13.32 GiB; torch build: *"
        ]
    )


def test_the_high_watermark_follows_pytorchs_variable(
    pytester: pytest.Pytester,
    physical_mac: MacFacts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "0.0")
    pytester.makepyfile("def test_ok(device): pass")
    result = pytester.runpytest("--mps-device=cpu")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps machine: *working set 17.76 GiB, high watermark none "
            "(PYTORCH_MPS_HIGH_WATERMARK_RATIO=0), largest buffer 13.32 GiB*"
        ]
    )


def test_a_hosted_runner_reads_as_virtual_with_its_signs(
    hosted_runner: MacFacts,
) -> None:
    found = fingerprint.read()
    assert found.virtual is True
    assert found.virtual_signs == (
        "GPU 'Apple Paravirtual device'",
        "model VirtualMac2,1",
        "chip 'Apple M1 (Virtual)'",
        "kern.hv_vmm_present=1",
    )
    # PyTorch's limit there: "max allowed: 1.70 GB" (opensoundscape#850)
    assert fingerprint.format_size(found.high_watermark or 0) == "1.70 GiB"
    assert "virtual" in found.line()


def test_a_physical_mac_is_not_virtual(physical_mac: MacFacts) -> None:
    found = fingerprint.read()
    assert found.virtual is False and found.virtual_signs == ()


@pytest.mark.parametrize("facts", [PHYSICAL, PARAVIRTUAL], ids=["physical", "runner"])
def test_the_report_json_and_junit_carry_the_fingerprint(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    facts: MacFacts,
) -> None:
    monkeypatch.setattr(backend, "mac_facts", lambda: facts)
    pytester.makepyfile("def test_ok(device): pass")
    result = pytester.runpytest(
        "--mps-device=cpu", "--mps-report=report.json", "--junitxml=junit.xml"
    )
    result.assert_outcomes(passed=1)
    machine = json.loads((pytester.path / "report.json").read_text())["pytest_mps"][
        "machine"
    ]
    assert machine["os"] == "macOS"
    assert machine["os_build"] == facts.build
    assert machine["gpu"] == facts.gpu
    assert machine["working_set"] == facts.working_set
    assert machine["virtual"] is (facts is PARAVIRTUAL)
    properties = {
        p.get("name"): p.get("value")
        for p in ET.parse(pytester.path / "junit.xml").iter("property")
    }
    assert properties["pytest_mps.machine.os_build"] == facts.build
    assert properties["pytest_mps.machine.chip"] == facts.chip
    assert properties["pytest_mps.machine.virtual"] == str(facts is PARAVIRTUAL)
    if facts is PARAVIRTUAL:
        assert (
            "GPU 'Apple Paravirtual device'"
            in (properties["pytest_mps.machine.virtual_signs"])
        )


def test_a_framework_version_is_read_from_its_bundle_plist(tmp_path: Path) -> None:
    import plistlib

    resources = tmp_path / "MetalPerformanceShadersGraph.framework" / "Resources"
    resources.mkdir(parents=True)
    with (resources / "version.plist").open("wb") as handle:
        plistlib.dump(
            {"CFBundleShortVersionString": "5.1.0", "CFBundleVersion": "5.1.0.12"},
            handle,
        )
    assert (
        mac_facts.framework_version("MetalPerformanceShadersGraph", tmp_path)
        == "5.1.0 (5.1.0.12)"
    )
    assert mac_facts.framework_version("Metal", tmp_path) is None


BENCH = "def test_sum(mps_benchmark):\n    mps_benchmark(sum, range(100))\n"
FAST = ("-p", "no:cacheprovider", "--mps-benchmark-max-time=0.01")


def test_benchmark_json_carries_the_fingerprint(
    pytester: pytest.Pytester, physical_mac: MacFacts
) -> None:
    pytester.makepyfile(BENCH)
    pytester.runpytest(*FAST, "--mps-benchmark-json=out.json").assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "out.json").read_text())
    saved = doc["machine_info"]["fingerprint"]
    assert saved["os_build"] == "24F74" and saved["mpsgraph"] == "5.1.0"


def test_a_baseline_from_another_os_build_is_named_and_can_be_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(BENCH)
    monkeypatch.setattr(backend, "mac_facts", lambda: PHYSICAL)
    pytester.runpytest(*FAST, "--mps-benchmark-save=base").assert_outcomes(passed=1)
    # the same Mac, after the image moved to macOS 26 (kornia#4202)
    upgraded = PHYSICAL._replace(macos="26.0", build="25A354", mpsgraph="6.0.0")
    monkeypatch.setattr(backend, "mac_facts", lambda: upgraded)
    warned = pytester.runpytest(*FAST, "--mps-benchmark-compare")
    warned.assert_outcomes(passed=1)
    warned.stdout.fnmatch_lines(
        [
            "pytest-mps benchmark: warning: baseline *0001_base.json ran on another "
            "machine setup (os_version 15.5 -> 26.0; os_build 24F74 -> 25A354; "
            "mpsgraph 5.1.0 -> 6.0.0): the comparison mixes them",
            "pytest-mps benchmark: compared with *0001_base.json",
        ]
    )
    assert warned.ret == 0
    refused = pytester.runpytest(
        *FAST, "--mps-benchmark-compare", "--mps-benchmark-compare-machine=refuse"
    )
    refused.stdout.fnmatch_lines(
        [
            "ERROR: baseline *0001_base.json ran on another machine setup "
            "(os_version 15.5 -> 26.0; os_build 24F74 -> 25A354; *); not compared "
            "(--mps-benchmark-compare-machine=refuse)"
        ]
    )
    refused.stdout.no_fnmatch_line("*compared with*")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR


def test_the_same_machine_compares_without_a_warning(
    pytester: pytest.Pytester, physical_mac: MacFacts
) -> None:
    pytester.makepyfile(BENCH)
    pytester.runpytest(*FAST, "--mps-benchmark-save=base").assert_outcomes(passed=1)
    result = pytester.runpytest(
        *FAST, "--mps-benchmark-compare", "--mps-benchmark-compare-machine=refuse"
    )
    result.stdout.no_fnmatch_line("*another machine setup*")
    assert result.ret == 0


def test_a_bad_compare_machine_value_is_one_usage_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_benchmark_compare_machine = maybe\n")
    pytester.makepyfile(BENCH)
    result = pytester.runpytest(*FAST)
    result.stderr.fnmatch_lines(
        [
            "ERROR: ini option mps_benchmark_compare_machine in *tox.ini: 'maybe' is "
            "not one of: warn, refuse"
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# -- virtual GPUs -------------------------------------------------------------------

DEVICE_TESTS = """
def test_on_each(device):
    import torch

    assert (torch.ones(2, device=device) * 2).sum().item() == 4.0
"""


def test_a_virtual_gpu_is_named_and_its_tests_run_by_default(
    pytester: pytest.Pytester, hosted_runner: MacFacts
) -> None:
    pytester.makepyfile(DEVICE_TESTS)
    result = pytester.runpytest("--mps-emulate", "--mps-device=cpu")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps machine: macOS 15.5 (24F74), *, Apple M1 (Virtual) "
            "(VirtualMac2,1), GPU Apple Paravirtual device, virtual; MPS memory: "
            "working set 1024.00 MiB, high watermark 1.70 GiB; *",
            "pytest-mps machine: virtual GPU (GPU 'Apple Paravirtual device'; model "
            "VirtualMac2,1; chip 'Apple M1 (Virtual)'; kern.hv_vmm_present=1; MPS "
            "working set 1024.00 MiB): MPS tests run on it (--mps-virtual-gpu=run; "
            "skip or emulate instead)",
            "pytest-mps machine: the MPS cache is emptied after each test: the GPU "
            "is virtual (--mps-empty-cache=auto)",
            "*",
            "pytest-mps machine: emptied the MPS cache after each of 2 tests (the "
            "GPU is virtual (--mps-empty-cache=auto))",
        ]
    )


def test_skip_skips_the_mps_tests_naming_the_signs(
    pytester: pytest.Pytester, hosted_runner: MacFacts
) -> None:
    pytester.makepyfile(
        DEVICE_TESTS
        + """
import pytest

@pytest.mark.mps
def test_marked():
    pass

def test_fixture(mps_device):
    pass

def test_plain():
    pass
"""
    )
    result = pytester.runpytest(
        "--mps-emulate", "--mps-device=cpu", "--mps-virtual-gpu=skip", "-rs"
    )
    # test_on_each[cpu] and test_plain run; the three MPS tests skip
    result.assert_outcomes(passed=2, skipped=3)
    skipped = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    counts = [int(line.split("[", 1)[1].split("]", 1)[0]) for line in skipped]
    assert sum(counts) == 3, skipped
    assert all(
        "MPS on a virtual GPU (GPU 'Apple Paravirtual device'; " in line
        for line in skipped
    )


def test_emulate_runs_the_mps_tests_on_the_emulated_device(
    pytester: pytest.Pytester, hosted_runner: MacFacts
) -> None:
    pytester.makepyfile(DEVICE_TESTS)
    # --mps alone on this Linux machine would be a usage error: the policy
    # turns the emulation on because the (shimmed) GPU reads as virtual
    result = pytester.runpytest("--mps", "--mps-virtual-gpu=emulate")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps: torch *, devices: mps; mps: emulated on the CPU *",
            "pytest-mps machine: virtual GPU (*): MPS tests run on the emulated "
            "device (--mps-virtual-gpu=emulate)",
        ]
    )


def test_emulate_leaves_a_physical_mac_alone(
    pytester: pytest.Pytester, physical_mac: MacFacts
) -> None:
    pytester.makepyfile(DEVICE_TESTS)
    result = pytester.runpytest("--mps", "--mps-virtual-gpu=emulate")
    # no emulation: the real MPS is asked for, and this Linux torch has none
    result.stderr.fnmatch_lines(["ERROR: --mps: MPS cannot be used: *"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


PROBED_CONFTEST = """
import time

import torch

from pytest_mps import backend, mac_facts
from pytest_mps.mac_facts import MacFacts

backend.mac_facts = lambda: MacFacts(
    macos="15.5", build="24F74", model="Mac14,10", chip="Apple M2 Pro", vmm=False,
    memory=24 << 30, gpu="{gpu}", gpu_cores=19, working_set=17 << 30,
    max_buffer=13 << 30, metal=None, mpsgraph=None,
)

def synchronize():
    {body}

# torch.mps as the device behaves: the emulated device's, replaced
torch.mps.synchronize = synchronize
"""


@pytest.mark.parametrize(
    ("gpu", "body", "line", "outcome"),
    [
        (
            "Apple Paravirtual device",
            "time.sleep(60)",
            "virtual GPU (GPU 'Apple Paravirtual device'; a 4-element op on mps "
            "did not finish within 0.5 s): MPS tests skip (*)",
            {"skipped": 1},
        ),
        (
            "Apple M2 Pro",
            # a slow first op alone does not make a physical Mac virtual
            "time.sleep(60)",
            "the MPS device is slow, not virtual: a 4-element op on mps did not "
            "finish within 0.5 s (--mps-probe-timeout), on a Mac with no sign of "
            "a virtual GPU*",
            {"passed": 1},
        ),
        (
            "Apple M2 Pro",
            # what a paravirtual GPU's first allocation raised (pytorch#111576)
            'raise RuntimeError("MPS backend out of memory (MPS allocated: 0 '
            "bytes, other allocations: 0 bytes, max allowed: 1.70 GB). Tried to "
            'allocate 0 bytes on private pool.")',
            "virtual GPU (a 4-element op on mps failed: RuntimeError: MPS backend "
            "out of memory (MPS allocated: 0 bytes, *): MPS tests skip (*)",
            {"skipped": 1},
        ),
    ],
    ids=["hangs-runner", "hangs-physical", "fails"],
)
def test_a_probe_that_hangs_or_fails_marks_the_gpu_virtual_or_slow(
    pytester: pytest.Pytester, gpu: str, body: str, line: str, outcome: dict[str, int]
) -> None:
    conftest = PROBED_CONFTEST.replace("{body}", body).replace("{gpu}", gpu)
    pytester.makeconftest(conftest)
    pytester.makepyfile(DEVICE_TESTS)
    result = pytester.runpytest_subprocess(
        "--mps-emulate",
        "--mps-probe-timeout=0.5",
        "--mps-virtual-gpu=skip",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines([f"pytest-mps machine: {line}"])


COUNTING_CONFTEST = """
import torch

calls = []
real = torch.mps.empty_cache

def empty_cache():
    calls.append(1)
    real()

torch.mps.empty_cache = empty_cache

def pytest_unconfigure(config):
    print(f"empty_cache called {len(calls)} times")
"""


@pytest.mark.parametrize(
    ("args", "emptied"),
    [
        (("--mps-emulate-memory=4GB",), 3),
        (("--mps-emulate-memory=4GB", "--mps-empty-cache=never"), 0),
        (("--mps-emulate-memory=64GB",), 0),
        (("--mps-emulate-memory=64GB", "--mps-empty-cache=always"), 3),
    ],
    ids=["small-auto", "small-never", "large-auto", "large-always"],
)
def test_the_cache_is_emptied_after_each_test_on_small_devices(
    pytester: pytest.Pytester, args: tuple[str, ...], emptied: int
) -> None:
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.parametrize('n', [1, 2, 3])\n"
        "def test_alloc(device, n):\n"
        "    import torch\n\n    torch.ones(n, device=device)\n"
    )
    result = pytester.runpytest_subprocess(
        "--mps-emulate", *args, "-s", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"empty_cache called {emptied} times"])
    if emptied:
        result.stdout.fnmatch_lines(
            ["pytest-mps machine: emptied the MPS cache after each of 3 tests (*)"]
        )
    else:
        result.stdout.no_fnmatch_line("*emptied the MPS cache*")


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (
            ("--mps-virtual-gpu=maybe",),
            "*--mps-virtual-gpu: 'maybe' is not one of: run, skip, emulate",
        ),
        (
            ("--mps-probe-timeout=-1",),
            "*--mps-probe-timeout: '-1' is not a number of seconds >= 0",
        ),
        (
            ("-o", "mps_empty_cache=sometimes"),
            "ERROR: ini option mps_empty_cache in *: 'sometimes' is not one of: "
            "auto, always, never",
        ),
    ],
)
def test_bad_machine_settings_are_one_usage_line_even_without_mps(
    pytester: pytest.Pytester, where: tuple[str, ...], expected: str
) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest(*where)
    result.stderr.fnmatch_lines([expected])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_memory_report_on_a_mac_names_all_three_limits(
    pytester: pytest.Pytester, physical_mac: MacFacts
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.mps_memory(max_mb=8)
        def test_over(device):
            kept = torch.empty(4 * 2**20, device=device)  # 16 MiB
            kept.fill_(1.0)
            torch.ones(1, device=device).sum()
        """
    )
    result = pytester.runpytest("--mps-emulate", "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*over the memory budget on mps: peak 16.0 MiB > max_mb=8",
            "peak from sampling torch.mps.current_allocated_memory() before each op*",
            "MPS limits: working set 17.76 GiB (*), high watermark 30.19 GiB (*), "
            "largest buffer 13.32 GiB (Metal's maxBufferLength: one tensor past it "
            "fails)",
        ]
    )


HANGING_OP = """
import os
import time

import torch

with open(os.environ["PROBE_PID_FILE"], "w") as file:
    file.write(str(os.getpid()))
torch.ones = lambda *args, **kwargs: time.sleep(600)  # a device that never answers
"""


def test_the_probe_runs_in_a_child_that_is_stopped_at_its_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pytest_mps import backend
    from pytest_mps.machine.probe import probe

    monkeypatch.setattr(backend, "answers", {})
    assert probe("cpu", 60.0) is None  # a real child process, a real op
    # the child's Python imports this first (site's sitecustomize)
    (tmp_path / "sitecustomize.py").write_text(HANGING_OP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PROBE_PID_FILE", str(tmp_path / "pid"))
    found = probe("cpu", 1.0)
    assert found is not None and found.slow
    assert found.text == "a 4-element op on cpu did not finish within 1 s"
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # stopped, not left on the device
        os.kill(pid, 0)
    assert backend.answers["probe"] == [True, found.text]  # what a server is given


# Each test leaves a 4 MiB device tensor in a reference cycle (as a mock
# holding the model does, TabPFN#1093); the collector stays off, as it would
# until allocations trigger it, so only pytest-mps's collection can free them.
CYCLES = """
import gc

import pytest
import torch

gc.disable()


@pytest.mark.parametrize("n", range(3))
def test_leaves_a_cycle(device, n):
    holder = {"weights": torch.ones(1 << 20, device=device)}
    holder["self"] = holder


def test_the_cycles_are_gone(device):
    assert torch.mps.current_allocated_memory() < 1 << 20
"""


@pytest.mark.parametrize("mode", ["always", "never"])
def test_empty_cache_frees_device_tensors_held_in_reference_cycles(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makepyfile(test_cycles=CYCLES)
    result = pytester.runpytest_subprocess(
        "--mps-emulate", f"--mps-empty-cache={mode}", "-p", "no:cacheprovider"
    )
    if mode == "never":  # the cycles stay: the last test sees 12 MiB on the device
        result.assert_outcomes(passed=3, failed=1)
        return
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "pytest-mps machine: emptied the MPS cache after each of 4 tests "
            "(--mps-empty-cache=always); 3 left device tensors in reference "
            "cycles, and a garbage collection after each freed 12.00 MiB"
        ]
    )
