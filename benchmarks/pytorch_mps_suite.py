"""PyTorch's own MPS tests under ``--mps-emulate``: passed, false alarms, misses.

``test/test_mps.py`` is what PyTorch's macOS CI runs on Apple silicon: each of
its tests passes on a Mac or is marked by PyTorch itself (skips, xfails, the
lists in ``torch/testing/_internal/common_mps.py``). Run under the emulation
it judges both halves of it:

- **passed**: passes, or is skipped or xfailed as PyTorch marks it;
- **false alarm**: fails emulated where a Mac passes;
- **miss**: expects an MPS error and gets none ("not raised", "DID NOT
  RAISE"), or is marked failing on MPS by PyTorch and passes emulated;
- **not emulatable**: fails with a line of the emulation's own naming what is
  not emulated: ``NotEmulatedError`` (Metal shaders, the profiler, MPS-only
  ops), or, for a test that fails or passes unexpectedly, what it touched
  that the emulation does not reproduce (MPS's random stream, the order of
  its sorts and parallel writes, Metal's numerics PyTorch names, another
  Python process: ``pytest_mps/emulate/unreproduced.py``);
- **newer**: tests a kernel the installed torch lacks on MPS
  (:data:`NEWER_KERNELS`) or behaviour it lacks (:data:`NEWER_TESTS`), when
  the file is newer than the torch.

Usage::

    python benchmarks/pytorch_mps_suite.py [--source test_mps.py] [--workdir DIR]
        [--only CLASS ...] [-n WORKERS] [--reuse]

Without ``--source`` it downloads ``test/test_mps.py`` at the installed torch's
release tag (``v2.13.0``) from GitHub; the file used, its sha256 and how near
it is to the installed torch are printed first. The runs are the hand-written
classes one by one, ``TestErrorInputs``, and the float32, float16 and bfloat16
slices of ``TestConsistency``; the large-memory tests are deselected
(:data:`DESELECT`); an empty Metal library stands in for the one PyTorch
keeps beside the file (:func:`metallib_stand_in`). The file reads the
machine's memory with ``sysctl -n hw.memsize`` at import: the script puts a
``sysctl`` that answers that one question on the runs' ``PATH`` (the
emulation leaves subprocesses as Linux). Not for CI: the whole run takes
about 25 minutes on 2 workers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

#: The runs, each a pytest selection (a class of the file, or a -k slice).
HAND_WRITTEN = (
    "TestAutocastMPS",
    "TestMemoryLeak",
    "TestPixelShuffle",
    "MPSReluTest",
    "MatmulTest",
    "MPSLeakyReluTest",
    "TestAvgPool",
    "TestMPS",
    "TestBinaryIteratorConformance",
    "TestBinaryDispatchRouting",
    "TestInnerContiguousMPS",
    "TestLogical",
    "TestSmoothL1Loss",
    "TestNLLLoss",
    "TestTopK",
    "TestNNMPS",
    "TestPad",
    "TestConv3dChannelsLast3dMPS",
    "TestLinalgMPSMPS",
    "TestSDPA",
    "TestGatherScatter",
    "TestViewOpsMPS",
    "TestConvolutionMPS",
    "TestAdvancedIndexing",
    "TestRNNMPS",
    "TestFallbackWarning",
    "TestNoRegression",
    "TestComplex",
    "TestCommonMPS",
    "TestMetalLibrary",
)
SLICES = {
    "TestErrorInputsMPS": "TestErrorInputsMPS",
    "TestConsistencyMPS float32": "TestConsistencyMPS and float32",
    "TestConsistencyMPS float16": "TestConsistencyMPS and float16 and not bfloat16",
    "TestConsistencyMPS bfloat16": "TestConsistencyMPS and bfloat16",
}
#: Tests that need more memory than a 24 GiB machine has (the data's README).
DESELECT = (
    "TestLargeTensors",
    "64bit",
    "test_copy_large",
    "large",
)

#: Kernels the file tests that the installed torch's native_functions.yaml
#: lacks for MPS (the copy in this workplace is slightly newer than torch
#: 2.13): a Mac with this torch raises PyTorch's NotImplementedError there too,
#: so such a failure is the file's version, not the emulation's.
NEWER_KERNELS = frozenset(
    {"aten::linalg_lstsq", "aten::_linalg_eigh", "aten::_ctc_loss"}
    | {"aten::poisson", "aten::_linalg_svd"}
)
#: Tests of MPS behaviour newer than the installed torch, by test-id pattern,
#: with the evidence: a Mac with this torch fails them too.
NEWER_TESTS: dict[str, str] = {
    # torch 2.13's release branch was cut 2026-06-10 (pytorch#186934,
    # #186959); these tests came with fixes merged after it
    r"test_fftn_too_many_dims": (
        "pytorch#186967 (merged 2026-06-12): MPS's FFT permutes the transformed "
        "dims last and refuses more than four; 2.13's kernel passes them to "
        "MPSGraph as they are (the SIGABRT of pytorch#186885)"
    ),
    r"test_local_response_norm_complex_input_raises": (
        "its regression test for pytorch#187611 (after the cut): 2.13 raises "
        "an opaque Metal RuntimeError for complex input, not NotImplementedError"
    ),
    r"test_index_put_accumulate_nondeterministic": (
        "the MPS alerts of pytorch#195754 (2026-09): torch 2.13.0's and "
        "2.14.1's use_deterministic_algorithms docs, which that change "
        "extended, name no MPS op"
    ),
}
_NOT_IMPLEMENTED = re.compile(
    r"The operator '(aten::[\w.]+)' is not currently implemented for the MPS device"
)

#: The emulation's own words for what it does not emulate (messages.py).
NOT_EMULATED = "not emulated by pytest-mps"
MISS_LINES = re.compile(
    r"not raised|DID NOT RAISE|DID NOT WARN|Unexpected success|XPASS\(strict\)"
    r"|expected .*(Error|Warning).* but got none|Regex didn.t match|does not match"
)


def fetch(version: str, workdir: Path) -> Path:
    """``test/test_mps.py`` at ``v<version>`` from GitHub, into ``workdir``."""
    tag = "v" + version.split("+")[0]
    url = f"https://raw.githubusercontent.com/pytorch/pytorch/{tag}/test/test_mps.py"
    target = workdir / "test_mps.py"
    print(f"downloading {url}", flush=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as exc:
        sys.exit(
            f"cannot download {url} ({exc}); pass --source with a copy of "
            "PyTorch's test/test_mps.py"
        )
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target


def sysctl_shim(directory: Path) -> None:
    """A ``sysctl`` that answers ``-n hw.memsize`` with this host's memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shim = directory / "sysctl"
    shim.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-n" ] && [ "$2" = "hw.memsize" ]; then echo {memory}; '
        'exit 0; fi\nexec /usr/sbin/sysctl "$@"\n'
    )
    shim.chmod(0o755)


def metallib_stand_in(directory: Path) -> None:
    """An empty ``metal/test_kernels.metallib`` beside the file, if none is there.

    ``test_load_precompiled_metallib`` reads a Metal library PyTorch keeps in
    its repository, which the copies of ``test_mps.py`` used here lack; the
    stand-in lets the test reach ``torch.mps.load_metallib``, which is what
    it tests (on a Mac as here, a missing file fails it first).
    """
    target = directory / "metal" / "test_kernels.metallib"
    if not target.exists():
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(b"")


class Outcome:
    """One test: ``passed``, ``skipped``, ``xfailed`` or ``failed``, its line."""

    __slots__ = ("first_line", "kind", "text")

    def __init__(self, kind: str, first_line: str = "", text: str = "") -> None:
        self.kind = kind
        self.first_line = first_line
        self.text = text


def first_line(text: str) -> str:
    """The error's first ``E`` line, or the message's first line."""
    for line in text.splitlines():
        if line.startswith("E  "):
            return line[1:].strip()[:200]
    return (text.strip().splitlines() or [""])[0][:200]


def read_junit(path: Path) -> dict[str, Outcome]:
    """Test id -> outcome."""
    found: dict[str, Outcome] = {}
    if not path.exists():
        return found
    for case in ET.parse(path).iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None or error is not None:
            node = failure if failure is not None else error
            assert node is not None
            text = (node.get("message") or "") + "\n" + (node.text or "")
            found[test_id] = Outcome("failed", first_line(text), text)
        elif skipped is not None:
            kind = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
            found[test_id] = Outcome(kind)
        else:
            found[test_id] = Outcome("passed")
    return found


def classify(test_id: str, outcome: Outcome) -> str:
    """``passed``, ``false alarm``, ``miss``, ``not emulatable`` or ``newer``."""
    if outcome.kind != "failed":
        return "passed"
    missing = _NOT_IMPLEMENTED.search(outcome.first_line)
    if missing is not None and missing.group(1) in NEWER_KERNELS:
        return "newer"
    if any(re.search(pattern, test_id) for pattern in NEWER_TESTS):
        return "newer"
    if NOT_EMULATED in outcome.text:
        return "not emulatable"
    if MISS_LINES.search(outcome.first_line) or MISS_LINES.search(outcome.text):
        return "miss"
    return "false alarm"


def run(
    name: str,
    selection: list[str],
    workdir: Path,
    environment: dict[str, str],
    workers: int,
    reuse: bool = False,
) -> tuple[dict[str, Outcome], float]:
    junit = workdir / (re.sub(r"\W+", "_", name) + ".xml")
    if reuse and junit.exists():
        return read_junit(junit), 0.0
    command = [
        sys.executable,
        "-m",
        "pytest",
        "test_mps.py",
        *selection,
        "--mps-emulate",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--tb=short",
        "--mps-timeout=600",
        f"--junitxml={junit}",
    ]
    if workers > 1:
        command += ["-n", str(workers)]
    start = time.perf_counter()
    subprocess.run(
        command,
        cwd=workdir,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=7200,
    )
    return read_junit(junit), time.perf_counter() - start


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="a copy of test/test_mps.py")
    parser.add_argument("--workdir", type=Path, help="where the runs' files go")
    parser.add_argument("--only", nargs="+", help="these runs only (class names)")
    parser.add_argument("-n", dest="workers", type=int, default=2)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read the JUnit files already in --workdir instead of running again",
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="test-mps-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.source is not None:
        data = args.source.read_bytes()
        if not (args.reuse and (workdir / "test_mps.py").exists()):
            (workdir / "test_mps.py").write_bytes(data)
        where = str(args.source)
    else:
        data = fetch(torch.__version__, workdir).read_bytes()
        where = f"PyTorch's test/test_mps.py at v{torch.__version__.split('+')[0]}"
    print(
        f"torch {torch.__version__}; {where} (sha256 "
        f"{hashlib.sha256(data).hexdigest()[:16]}...); workdir {workdir}",
        flush=True,
    )
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    sysctl_shim(bin_dir)
    metallib_stand_in(workdir)
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        # PyTorch's TestCase appends a repro note to each failure
        "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",
    }
    runs: dict[str, list[str]] = {
        name: ["-k", f"{name} and " + " and ".join(f"not {d}" for d in DESELECT)]
        for name in HAND_WRITTEN
    }
    runs.update(
        {
            name: ["-k", f"{k} and " + " and ".join(f"not {d}" for d in DESELECT)]
            for name, k in SLICES.items()
        }
    )
    if args.only:
        runs = {name: sel for name, sel in runs.items() if name in args.only}
    totals: Counter[str] = Counter()
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    print(
        f"\n{'run':32s} {'tests':>6s} {'passed':>7s} {'false':>6s} {'miss':>5s} "
        f"{'not em.':>8s} {'newer':>6s} {'s':>5s}"
    )
    for name, selection in runs.items():
        found, seconds = run(
            name, selection, workdir, environment, args.workers, args.reuse
        )
        counts: Counter[str] = Counter()
        for test_id, outcome in found.items():
            verdict = classify(test_id, outcome)
            counts[verdict] += 1
            if verdict != "passed":
                groups[(verdict, outcome.first_line)].append(test_id)
        totals.update(counts)
        totals["tests"] += len(found)
        print(
            f"{name:32s} {len(found):6d} {counts['passed']:7d} "
            f"{counts['false alarm']:6d} {counts['miss']:5d} "
            f"{counts['not emulatable']:8d} {counts['newer']:6d} {seconds:5.0f}",
            flush=True,
        )
    print(
        f"{'all':32s} {totals['tests']:6d} {totals['passed']:7d} "
        f"{totals['false alarm']:6d} {totals['miss']:5d} "
        f"{totals['not emulatable']:8d} {totals['newer']:6d}"
    )
    plural = {
        "false alarm": "false alarms",
        "miss": "misses",
        "newer": "newer than the installed torch",
    }
    print("\nnewer than the installed torch, by the script's table (NEWER_TESTS):")
    for pattern, reason in NEWER_TESTS.items():
        print(f"  {pattern}: {reason}")
    for verdict in ("false alarm", "miss", "not emulatable", "newer"):
        chosen = [(line, ids) for (v, line), ids in groups.items() if v == verdict]
        if not chosen:
            continue
        print(f"\n== {plural.get(verdict, verdict)}, by first line")
        for line, ids in sorted(chosen, key=lambda g: -len(g[1])):
            print(f"{len(ids):4d}  {line}")
            for test_id in ids[:3]:
                print(f"      {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
