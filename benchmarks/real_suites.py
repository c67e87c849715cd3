"""Third-party test suites, plain and under ``--mps-emulate``: every new failure, read.

A suite that uses the mps device when it is available runs twice in a venv of
its own, on the CPU and on the emulated MPS device; the outcomes are matched
per test id (the device's name in the id aside), and every test that passes
plain and fails emulated is printed with its first error line, grouped by
that line. Each group is checked against :data:`KNOWN_TRUE`, the MPS
limitations a Mac has too (the reason and PyTorch's source for each), so the
script counts true failures and false alarms; a failure raised inside
pytest-mps itself is counted apart. Not for CI: a run takes minutes to an
hour and needs the network (or a local copy of the suite).

Usage::

    python benchmarks/real_suites.py kornia [--source DIR] [--paths tests/color ...]
    python benchmarks/real_suites.py accelerate [--source DIR]
    python benchmarks/real_suites.py lightning [--source DIR]

Lightning's run is its ``RunIf(mps=True)`` tests (every case of each), which
skip on the CPU: the script says how many run emulated and which fail.

``--source`` takes a checkout or an unpacked sdist (without it, kornia is
cloned at :data:`SUITES`' pinned commit and accelerate's sdist downloaded
from PyPI at its pinned version). ``--venv DIR`` reuses a venv (made once
with torch, pytest, the suite and pytest-mps, editable); ``--workdir`` keeps
the JUnit files. ``-k`` passes through to pytest. ``--pairs N`` runs both
sides N times, interleaved, and prints the ratio of their wall times.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Suite:
    """A third-party suite: where it comes from and how it runs on each side."""

    pin: str  # a git commit (kornia) or a PyPI version (accelerate)
    paths: tuple[str, ...]
    plain: tuple[str, ...]  # pytest arguments of the CPU run
    emulated: tuple[str, ...]  # and of the emulated run
    requires: tuple[str, ...] = ()
    device_in_ids: bool = False  # ids name the device: [cpu-float32] / [mps-float32]
    extra: dict[str, str] = field(default_factory=dict)
    # run only the test functions whose decorators hold this text (Lightning's
    # RunIf(mps=True)), every case of each
    decorated: str = ""
    # a pip requirement installed instead of the source tree (editable)
    install: str = ""


SUITES = {
    # kornia's conftest parametrizes by its own --device (cpu, cuda, mps when
    # torch.backends.mps.is_available()); its tests live only in its repository
    "kornia": Suite(
        pin="b4f5a78a1",
        paths=(
            "tests/color",
            "tests/filters",
            "tests/enhance",
            "tests/morphology",
            "tests/losses",
            "tests/metrics",
            "tests/geometry/test_homography.py",
            "tests/geometry/test_depth.py",
            "tests/geometry/transform/test_imgwarp.py",
            "tests/augmentation/test_augmentation_mix.py",
        ),
        plain=("--device", "cpu", "--dtype", "float32"),
        emulated=("--mps-emulate", "--device", "mps", "--dtype", "float32"),
        requires=("kornia_rs", "numpy", "packaging"),
        device_in_ids=True,
        extra={"git": "https://github.com/kornia/kornia"},
    ),
    # torch_geometric's withDevice adds an mps case beside the cpu one when
    # MPS is available (torch_geometric.is_mps_available makes a tensor there)
    "torch_geometric": Suite(
        pin="5c6461b23",
        paths=(
            "test/loader/test_cache.py",
            "test/loader/test_dataloader.py",
            "test/nn/conv/test_gat_conv.py",
            "test/nn/conv/test_hetero_conv.py",
            "test/nn/conv/test_rgcn_conv.py",
            "test/nn/conv/test_sage_conv.py",
            "test/nn/dense/test_linear.py",
            "test/nn/models/test_basic_gnn.py",
            "test/nn/models/test_deep_graph_infomax.py",
            "test/nn/models/test_metapath2vec.py",
            "test/nn/models/test_node2vec.py",
            "test/nn/norm",
            "test/nn/test_encoding.py",
            "test/transforms/test_to_device.py",
            "test/utils/test_index_sort.py",
            "test/utils/test_map.py",
            "test/utils/test_scatter.py",
            "test/utils/test_subgraph.py",
        ),
        plain=(),
        emulated=("--mps-emulate",),
        requires=(
            "numpy",
            "psutil",
            "pyparsing",
            "requests",
            "tqdm",
            "xxhash",
            "aiohttp",
            "fsspec",
            "jinja2",
        ),
        device_in_ids=True,
        extra={"git": "https://github.com/pyg-team/pytorch_geometric"},
    ),
    # Lightning marks its MPS tests RunIf(mps=True), which asks
    # MPSAccelerator.is_available(): torch.backends.mps.is_available() and
    # platform.processor() in ("arm", "arm64"); the tests live in its
    # repository, the package is PyPI's at the same version
    "lightning": Suite(
        pin="2.6.5",
        paths=("tests/tests_fabric", "tests/tests_pytorch"),
        plain=(),
        emulated=("--mps-emulate",),
        requires=(
            "lightning==2.6.5",
            "cloudpickle",
            "onnx",
            "onnxruntime",
            "onnxscript",
            "psutil",
            "scikit-learn",
            "tensorboardX",
        ),
        extra={"git": "https://github.com/Lightning-AI/pytorch-lightning"},
        decorated="mps=True",
        install="lightning==2.6.5",
    ),
    # accelerate picks mps itself when torch.backends.mps.is_available(); its
    # sdist ships the tests
    "accelerate": Suite(
        pin="1.15.0",
        paths=(
            "tests/test_accelerator.py",
            "tests/test_big_modeling.py",
            "tests/test_cpu.py",
            "tests/test_data_loader.py",
            "tests/test_grad_sync.py",
            "tests/test_hooks.py",
            "tests/test_kwargs_handlers.py",
            "tests/test_memory_utils.py",
            "tests/test_modeling_utils.py",
            "tests/test_optimizer.py",
            "tests/test_scheduler.py",
            "tests/test_state_checkpointing.py",
            "tests/test_utils.py",
        ),
        plain=(),
        emulated=("--mps-emulate",),
        requires=(
            "numpy",
            "packaging",
            "psutil",
            "pyyaml",
            "huggingface_hub",
            "safetensors",
            "parameterized",
            "transformers",
            "pytest-subtests",
            "pytest-order",
        ),
    ),
}


@dataclass(frozen=True)
class Limitation:
    """A failure a Mac has too: what it says, why, and PyTorch's source for it."""

    pattern: str  # a regular expression on the first error line
    reason: str
    source: str


#: MPS limitations that a Mac shows with the same first line. A new failure
#: that matches none of them counts as a false alarm until it is read.
KNOWN_TRUE = (
    Limitation(
        r"is not currently implemented for the MPS device",
        "the op has no MPS kernel in the installed torch",
        "native_functions.yaml of the wheel; aten/src/ATen/mps/MPSFallback.mm",
    ),
    Limitation(
        r"Cannot convert a MPS Tensor to float64",
        "MPS holds no float64",
        "aten/src/ATen/mps/EmptyTensor.cpp",
    ),
    Limitation(
        r"Expected all tensors to be on the same device, but found at least two "
        r"devices, mps:0 and cpu",
        "a CPU tensor the code passed into device math (torch.where with a CPU "
        "condition, a CPU constant)",
        "aten/src/ATen/TensorIterator.cpp (compute_types)",
    ),
    Limitation(
        r"Placeholder storage has not been allocated on MPS device",
        "a CPU tensor the code passed to an MPSGraph kernel",
        "aten/src/ATen/native/mps/OperationUtils.mm (Placeholder)",
    ),
    Limitation(
        r"is on CPU, but expected it to be on GPU",
        "a CPU tensor passed to a kernel that checks with checkAllSameGPU",
        "aten/src/ATen/native/mps/operations/LinearAlgebra.mm",
    ),
    Limitation(
        r"Tensor for argument \w+ is on cpu but expected on mps",
        "a CPU weight, bias or input of linear",
        "aten/src/ATen/native/mps/operations/Linear.mm",
    ),
    Limitation(
        r"can't convert mps:0 device type tensor to numpy",
        "numpy() of a device tensor",
        "torch/csrc/utils/tensor_numpy.cpp",
    ),
    Limitation(
        r"Expected a 'mps' device type for generator but found 'cpu'",
        "a CPU generator drawing device tensors",
        "aten/src/ATen/core/Generator.h",
    ),
    Limitation(
        r"Adaptive pool MPS: input sizes must be divisible by output sizes",
        "adaptive pooling whose input is not a multiple of its output",
        "aten/src/ATen/native/mps/operations/AdaptivePooling.mm",
    ),
    Limitation(
        r"must be on the same device\. Got patch\.device: mps:0 src_H_dst\.device: cpu",
        "kornia's own device check: the test leaves its registration model on the "
        "CPU (no .to(device)) and warps device images with it",
        "kornia/geometry/transform/imgwarp.py (homography_warp)",
    ),
    Limitation(
        r"binds its tensor inputs as Metal buffers",
        "a 0-dim CPU tensor in a kernel that binds its inputs as Metal buffers: "
        "a crash on a Mac",
        "aten/src/ATen/native/mps/operations/Lerp.mm; nanochat PR #145",
    ),
)


#: Tests that expect an error an older torch raised on a Mac and the installed
#: one no longer does: "DID NOT RAISE" on a Mac too, so not a miss. Test id
#: pattern (on ``module::name[params]``) -> the limitation the test remembers.
OUTDATED = {
    r"\.test_scatter::test_scatter_backward\[(min|max)-": Limitation(
        r"DID NOT RAISE",
        "the test expects scatter_reduce (amax/amin) to have no MPS kernel, as "
        "in torch 2.0-2.2 (pytorch#97093); torch 2.6 onwards has one, so a "
        "Mac runs it and the test fails there too",
        "native_functions.yaml: scatter_reduce.two_out dispatches MPS",
    ),
}


def outdated(test_id: str) -> Limitation | None:
    """The older torch's limitation a test still expects, if any."""
    for pattern, known in OUTDATED.items():
        if re.search(pattern, test_id):
            return known
    return None


def decorated_tests(source: Path, paths: list[str], text: str) -> list[str]:
    """Node ids of the test functions under ``paths`` whose decorators hold ``text``.

    A class's test methods count when the class or the method is decorated.
    """
    import ast

    found = []
    files = []
    for path in paths:
        where = source / path
        files += sorted(where.rglob("test_*.py")) if where.is_dir() else [where]
    for file in files:
        code = file.read_text(encoding="utf-8")
        if text not in code:
            continue
        relative = file.relative_to(source)

        def marked(node: ast.AST, code: str = code) -> bool:
            decorators = getattr(node, "decorator_list", [])
            return any(
                text in (ast.get_source_segment(code, d) or "") for d in decorators
            )

        for node in ast.parse(code).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and marked(
                node
            ):
                found.append(f"{relative}::{node.name}")
            elif isinstance(node, ast.ClassDef):
                for method in node.body:
                    if (
                        isinstance(method, ast.FunctionDef)
                        and method.name.startswith("test")
                        and (marked(node) or marked(method))
                    ):
                        found.append(f"{relative}::{node.name}::{method.name}")
    return found


def collectable(python: Path, source: Path, ids: list[str]) -> list[str]:
    """The ids whose file pytest collects here, the others named and left out.

    A node id in a file that fails to import ends the whole run ("found no
    collectors"): Lightning 2.6.5's tests/tests_fabric/test_cli.py imports
    ``_consolidate``, which its PyPI wheel's ``lightning.fabric.cli`` lacks.
    """
    files = sorted({i.split("::")[0] for i in ids})
    listed = subprocess.run(
        [str(python), "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", "--continue-on-collection-errors", *files],
        cwd=source, capture_output=True, text=True, timeout=1800,
    ).stdout  # fmt: skip
    found = {line.split("[")[0] for line in listed.splitlines() if "::" in line}
    kept = [i for i in ids if i in found]
    for left in sorted(set(ids) - set(kept)):
        print(f"left out, pytest does not collect it here: {left}")
    return kept


def run(command: list[str], cwd: Path | None = None, timeout: float = 7200) -> None:
    """Run ``command`` showing it; stop the script if it fails."""
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, check=True, timeout=timeout)


def fetch(name: str, suite: Suite, workdir: Path) -> Path:
    """A checkout of the suite at its pin, under ``workdir``."""
    target = workdir / name
    if target.exists():
        return target
    if "git" in suite.extra:
        run(["git", "clone", "--filter=blob:none", suite.extra["git"], str(target)])
        run(["git", "checkout", "-q", suite.pin], cwd=target)
        return target
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{name}=={suite.pin}",
            "-d",
            str(workdir),
        ]
    )
    (archive,) = workdir.glob(f"{name}-{suite.pin}.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    (workdir / f"{name}-{suite.pin}").rename(target)
    return target


def make_venv(source: Path, suite: Suite, venv: Path) -> Path:
    """A venv with this torch, pytest, the suite and pytest-mps (editable)."""
    import torch

    python = venv / "bin" / "python"
    if python.exists():
        return python
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    run([*pip, f"torch=={torch.__version__.split('+')[0]}"])
    run([*pip, "pytest", *suite.requires])
    if not suite.install:
        run([*pip, "--no-deps", "-e", str(source)])
    run([*pip, "--no-deps", "-e", str(ROOT)])
    return python


@dataclass
class Outcome:
    """One test's outcome and its first error line."""

    passed: bool
    skipped: bool
    first_line: str = ""
    in_pytest_mps: bool = False


def outcomes(junit: Path, device_in_ids: bool) -> dict[str, Outcome]:
    """Test id -> outcome, from a JUnit XML file.

    Where ids name the device, the device is left out of them; a suite that
    runs a cpu and an mps case side by side (torch_geometric's withDevice)
    is compared through its mps case.
    """
    found: dict[str, Outcome] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if device_in_ids:
            on_mps = re.search(r"\bmps(:0)?\b", test_id) is not None
            test_id = re.sub(r"\b(mps|cpu)(:0)?\b", "DEVICE", test_id)
            if test_id in found and not on_mps:
                continue  # the mps case of this test was read already
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped") is not None
        if problem is None:
            found[test_id] = Outcome(passed=not skipped, skipped=skipped)
            continue
        text = (problem.get("message") or "") + "\n" + (problem.text or "")
        found[test_id] = Outcome(
            passed=False,
            skipped=False,
            first_line=first_error_line(text),
            in_pytest_mps=_raised_in_pytest_mps(problem.text or ""),
        )
    return found


def first_error_line(text: str) -> str:
    """The exception's first line, numbers of the test's data left out."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("E ") or re.match(r"^\w+(Error|Exception)\b", stripped):
            line = stripped.removeprefix("E").strip()
            return line[:240]
    return text.strip().splitlines()[0][:240] if text.strip() else "(no message)"


def _raised_in_pytest_mps(traceback: str) -> bool:
    """True when the last frame of the traceback is pytest-mps's own code."""
    frames = re.findall(r"^(\S+\.py):\d+: ", traceback, flags=re.MULTILINE)
    return bool(frames) and "pytest_mps" in frames[-1]


def classify(line: str) -> Limitation | None:
    """The known MPS limitation a first error line shows, if any."""
    for known in KNOWN_TRUE:
        if re.search(known.pattern, line):
            return known
    return None


def report(name: str, plain: dict[str, Outcome], emulated: dict[str, Outcome]) -> int:
    """Print the comparison; return the number of false alarms."""
    new = {
        test_id: emulated[test_id]
        for test_id, outcome in plain.items()
        if outcome.passed
        and test_id in emulated
        and not emulated[test_id].passed
        and not emulated[test_id].skipped
    }
    groups: dict[str, list[str]] = defaultdict(list)
    for test_id, outcome in sorted(new.items()):
        groups[outcome.first_line].append(test_id)
    true = false = ours = missed = 0
    print(f"\n== {name}: tests that pass on the CPU and fail emulated, by first line")
    for line, tests in sorted(groups.items(), key=lambda g: -len(g[1])):
        known = classify(line)
        if line.startswith("Failed: DID NOT RAISE"):
            stale = [t for t in tests if outdated(t) is not None]
            if stale:
                true += len(stale)
                known = outdated(stale[0])
                assert known is not None
                print(
                    f"\n{len(stale):4d}  {line}\n      true, the test is older than "
                    f"torch: {known.reason} [{known.source}]"
                )
                for test_id in stale[:3]:
                    print(f"      {test_id}")
                tests = [t for t in tests if t not in stale]
                if not tests:
                    continue
            # the suite asserts a failure a Mac has, which the emulation lacks:
            # a miss (see the argument rules), not a false alarm
            missed += len(tests)
            print(f"\n{len(tests):4d}  {line}\n      MISSED: a Mac raises here")
            for test_id in tests[:3]:
                print(f"      {test_id}")
            continue
        # PyTorch's messages that the emulation raises itself come from
        # pytest_mps by design; an unknown one raised there is our bug
        inside = 0 if known is not None else sum(new[t].in_pytest_mps for t in tests)
        ours += inside
        if known is not None:
            true += len(tests)
            verdict = f"true: {known.reason} [{known.source}]"
        else:
            false += len(tests)
            verdict = "FALSE ALARM" + (
                f" ({inside} inside pytest_mps)" if inside else ""
            )
        print(f"\n{len(tests):4d}  {line}\n      {verdict}")
        for test_id in tests[:3]:
            print(f"      {test_id}")
        if len(tests) > 3:
            print(f"      ... and {len(tests) - 3} more")
    ran = sum(1 for o in plain.values() if o.passed)
    unlocked = {
        test_id: outcome
        for test_id, outcome in emulated.items()
        if test_id in plain and plain[test_id].skipped and not outcome.skipped
    }
    if unlocked:
        failing = {t: o for t, o in unlocked.items() if not o.passed}
        print(
            f"\n== {name}: {len(unlocked)} tests skip on the CPU and run emulated: "
            f"{len(unlocked) - len(failing)} passed, {len(failing)} failed"
        )
        for test_id, outcome in sorted(failing.items()):
            print(f"      {test_id}: {outcome.first_line}")
    print(
        f"\n== {name}: {ran} passed on the CPU; {len(new)} of them fail emulated: "
        f"{true} true MPS limitations, {false} false alarms "
        f"({ours} raised inside pytest_mps), {missed} Mac failures missed"
    )
    return false


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--source", type=Path, help="a checkout or unpacked sdist")
    parser.add_argument("--venv", type=Path, help="a venv to make or reuse")
    parser.add_argument("--workdir", type=Path, help="where clones and results go")
    parser.add_argument("--paths", nargs="+", help="test paths (default: the pinned)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k")
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="run plain and emulated this many times, interleaved, for the time ratio",
    )
    args = parser.parse_args()
    suite = SUITES[args.suite]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"real-{args.suite}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    source = args.source or fetch(args.suite, suite, workdir)
    python = make_venv(source, suite, args.venv or workdir / "venv")
    paths = args.paths or list(suite.paths)
    if suite.decorated:
        paths = decorated_tests(source, paths, suite.decorated)
        print(f"{len(paths)} test functions decorated with {suite.decorated!r}")
        paths = collectable(python, source, paths)
    common = [
        "-m",
        "pytest",
        *paths,
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--tb=short",
    ]
    if args.keyword:
        common += ["-k", args.keyword]
    results: dict[str, dict[str, Outcome]] = {}
    ratios = []
    for pair in range(args.pairs):
        seconds = {}
        for side, extra in (("plain", suite.plain), ("emulated", suite.emulated)):
            junit = workdir / f"{args.suite}-{side}.xml"
            start = time.perf_counter()
            command = [str(python), *common, *extra, f"--junitxml={junit}"]
            print("$", " ".join(command), flush=True)
            subprocess.run(command, cwd=source, timeout=7200, stdout=subprocess.DEVNULL)
            seconds[side] = time.perf_counter() - start
            if pair == 0:
                results[side] = outcomes(junit, suite.device_in_ids)
            print(f"pair {pair + 1} {side}: {seconds[side]:.0f} s", flush=True)
        ratios.append(seconds["emulated"] / seconds["plain"])
    print(
        f"emulated / plain time, {len(ratios)} interleaved pair(s): "
        + ", ".join(f"{r:.2f}x" for r in ratios)
        + f"; median {statistics.median(ratios):.2f}x"
    )
    report(args.suite, results["plain"], results["emulated"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
