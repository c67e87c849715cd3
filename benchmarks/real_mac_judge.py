"""``--mps-emulate`` judged test by test against a real Mac's published results.

A project that runs its suite on a real Mac and publishes the exact failures
(kornia: ``testing/known_failure_xfails/mps_float32.txt``, one line
``<exception type>\\t<node id>`` per failure of a hosted ``macos-26-arm64``
run) is the judge of the emulation: run the same suite on Linux under
``--mps-emulate`` with the torch that Mac ran, and every test's outcome is
either the Mac's or a defect of the emulation. The script prints the
confusion matrix and the causes:

- **caught**: the Mac failed it and so did the emulation, with the Mac's
  exception type or with another;
- **missed**: the Mac failed it, the emulation passed (or skipped) it;
- **false alarm**: the Mac passed it (it is not listed), the emulation
  failed it;
- **not comparable**: the ids a file of ``<node id>\\t<why>`` lines names
  (the suite changed between the tree run here and the Mac's run, or the
  test needs the network); they are left out and counted.

Causes group the false alarms and misses by the emulated error's first line
(numbers and addresses blanked), most common first, each with one node id.

Usage (kornia, as ``../shared/data/kornia_real_mac/README.md`` says: its
tree at b4f5a78, torch 2.9.1 as that Mac ran, a venv with torch, pytest,
pytest-mps editable, ``kornia_rs`` and kornia editable)::

    python benchmarks/real_mac_judge.py --suite /tmp/kornia \\
        --python .venv-t291/bin/python \\
        --mac-list ../shared/data/kornia_real_mac/mps_float32.txt \\
        --not-comparable ../shared/data/kornia_real_mac/not_comparable.tsv \\
        --results /tmp/kornia-emulated.tsv -n 2

``--results`` keeps each test's emulated outcome (written as the run goes,
so a stopped run keeps what it had); ``--reuse`` judges a results file again
without running. ``--paths`` runs part of the suite (then only the Mac's
failures inside those paths count). Not for CI: the whole of kornia takes
about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: The run's recorder, loaded into the suite's pytest with ``-p``: one line
#: per test (``node id``, outcome, exception type, first line), written in
#: the controller as reports arrive (under pytest-xdist too: the type travels
#: in the report's user_properties).
RECORDER = """
import os
import pytest

_OUT = os.environ["REAL_MAC_JUDGE_RESULTS"]
_seen = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and report.failed:
        text = call.excinfo.exconly().splitlines() or [""]
        report.user_properties.append(
            ("real_mac_judge", (call.excinfo.typename, text[0][:300]))
        )
    return report


def pytest_runtest_logreport(report):
    failure = dict(report.user_properties).get("real_mac_judge")
    if report.failed:
        kind, line = failure or ("Failed", str(report.longrepr).splitlines()[-1:])
        _seen[report.nodeid] = ("failed", kind, line if isinstance(line, str) else "")
    elif report.when == "call" or report.skipped:
        outcome = "skipped" if report.skipped else "passed"
        _seen.setdefault(report.nodeid, (outcome, "", ""))
    if report.when == "teardown" and report.nodeid in _seen:
        outcome, kind, line = _seen.pop(report.nodeid)
        line = line.replace("\\t", " ").replace("\\n", " ")
        with open(_OUT, "a", encoding="utf-8") as out:
            out.write(f"{report.nodeid}\\t{outcome}\\t{kind}\\t{line}\\n")
"""


@dataclass
class Verdicts:
    """The comparison, id by id."""

    caught_same: list[str] = field(default_factory=list)
    caught_other: list[tuple[str, str, str]] = field(default_factory=list)
    missed: list[tuple[str, str]] = field(default_factory=list)
    false_alarms: list[tuple[str, str, str]] = field(default_factory=list)
    agreed_pass: int = 0
    left_out: int = 0
    not_run: list[str] = field(default_factory=list)


def read_mac_list(path: Path) -> dict[str, str]:
    """``<exception type>\\t<node id>`` lines (``#`` comments) as id -> type."""
    failures = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        kind, sep, node = line.partition("\t")
        if not sep or not node.strip():
            raise SystemExit(f"{path}:{number}: not '<type>\\t<node id>': {line!r}")
        failures[node.strip()] = kind.strip()
    return failures


def read_ids(path: Path | None) -> set[str]:
    """The first column of a tab-separated file (``#`` comments)."""
    if path is None:
        return set()
    return {
        line.split("\t", 1)[0].strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }


def read_results(path: Path) -> dict[str, tuple[str, str, str]]:
    """The recorder's lines as id -> (outcome, type, first line)."""
    results = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            parts += [""] * (4 - len(parts))
            results[parts[0]] = (parts[1], parts[2], parts[3])
    return results


def judge(
    mac: dict[str, str],
    emulated: dict[str, tuple[str, str, str]],
    left_out: set[str],
    paths: tuple[str, ...] = (),
) -> Verdicts:
    """Compare outcome by outcome; ``paths`` limits the Mac's list to a part."""
    verdicts = Verdicts()
    for node, (outcome, kind, line) in sorted(emulated.items()):
        if node in left_out:
            verdicts.left_out += 1
            continue
        real = mac.get(node)
        if outcome == "failed":
            if real is None:
                verdicts.false_alarms.append((node, kind, line))
            elif real == kind:
                verdicts.caught_same.append(node)
            else:
                verdicts.caught_other.append((node, real, f"{kind}: {line}"))
        elif real is not None:
            verdicts.missed.append((node, real))
        else:
            verdicts.agreed_pass += 1
    for node in sorted(mac):
        inside = not paths or node.startswith(paths)
        if inside and node not in emulated and node not in left_out:
            verdicts.not_run.append(node)
    return verdicts


def cause(line: str) -> str:
    """A first error line with its particulars blanked, to group by."""
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", line)
    line = re.sub(r"commit hash \w+", "commit hash …", line)
    return line[:160]


def table(verdicts: Verdicts) -> str:
    caught = len(verdicts.caught_same) + len(verdicts.caught_other)
    real = caught + len(verdicts.missed)
    alarms = len(verdicts.false_alarms)
    lines = [
        f"{'verdict':<34}{'tests':>7}",
        f"{'caught, the Mac’s exception type':<34}{len(verdicts.caught_same):>7}",
        f"{'caught, another type':<34}{len(verdicts.caught_other):>7}",
        f"{'missed (the Mac failed it)':<34}{len(verdicts.missed):>7}",
        f"{'false alarms (the Mac passed it)':<34}{alarms:>7}",
        f"{'agreed: passed or skipped':<34}{verdicts.agreed_pass:>7}",
        f"{'not comparable (left out)':<34}{verdicts.left_out:>7}",
        f"{'listed by the Mac, not run here':<34}{len(verdicts.not_run):>7}",
    ]
    if real:
        lines.append(
            f"recall {caught / real:.2f} ({caught} of {real}), with the Mac's type "
            f"{len(verdicts.caught_same) / real:.2f}"
        )
    if caught + alarms:
        lines.append(f"precision {caught / (caught + alarms):.2f}")
    return "\n".join(lines)


def causes(rows: list[tuple[str, str, str]], title: str) -> str:
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for node, kind, line in rows:
        key = cause(f"{kind}: {line}")
        counts[key] += 1
        example.setdefault(key, node)
    if not counts:
        return f"{title}: none"
    out = [f"{title} by cause ({sum(counts.values())}):"]
    for key, count in counts.most_common():
        out.append(f"{count:>6}  {key}\n        e.g. {example[key]}")
    return "\n".join(out)


def run_suite(args: argparse.Namespace, results: Path) -> float:
    """Run the suite under the emulation, recording into ``results``."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("", encoding="utf-8")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "real_mac_judge_recorder.py").write_text(
            RECORDER, encoding="utf-8"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [folder, str(Path(__file__).resolve().parent.parent)]
            + [p for p in [env.get("PYTHONPATH")] if p]
        )
        env["REAL_MAC_JUDGE_RESULTS"] = str(results)
        env.pop("PYTORCH_ENABLE_MPS_FALLBACK", None)  # the Mac ran without it
        command = [
            args.python,
            "-m",
            "pytest",
            *(args.paths or ["tests"]),
            "--mps-emulate",
            *args.device_args,
            "-p",
            "real_mac_judge_recorder",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=",
            *(["-n", str(args.n)] if args.n else []),
            *args.pytest_args,
        ]
        print("running:", " ".join(command), file=sys.stderr)
        started = time.perf_counter()
        subprocess.run(command, cwd=args.suite, env=env, check=False)
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--suite", type=Path, required=True, help="the suite's checkout"
    )
    parser.add_argument("--mac-list", type=Path, required=True)
    parser.add_argument("--not-comparable", type=Path)
    parser.add_argument("--python", default=sys.executable, help="the suite's venv")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="judge --results again")
    parser.add_argument("--paths", nargs="*", default=[])
    parser.add_argument("-n", type=int, default=0, help="pytest-xdist workers")
    parser.add_argument(
        "--device-args",
        nargs="*",
        default=[
            "--device",
            "mps",
            "--dtype",
            "float32",
            "-p",
            "no:cov",
            "-p",
            "no:timeout",
        ],
        help="the suite's own arguments for its mps run (kornia's by default)",
    )
    parser.add_argument("--json", type=Path, help="write the verdicts here too")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    args.results = args.results.resolve()
    if os.sep in args.python:  # the suite runs in its own folder
        args.python = str(Path(args.python).absolute())

    mac = read_mac_list(args.mac_list)
    left_out = read_ids(args.not_comparable)
    seconds = None
    if not args.reuse:
        seconds = run_suite(args, args.results)
    emulated = {
        node: result
        for node, result in read_results(args.results).items()
        if "[mps" in node or "mps" in node.rsplit("[", 1)[-1]
    }
    verdicts = judge(mac, emulated, left_out, tuple(args.paths))
    print(f"emulated results: {len(emulated)} mps tests ({args.results})")
    if seconds is not None:
        print(f"run took {seconds / 60:.1f} min")
    print(table(verdicts))
    print()
    print(causes(verdicts.false_alarms, "false alarms"))
    print()
    print(
        causes([(n, real, "passed emulated") for n, real in verdicts.missed], "misses")
    )
    if verdicts.caught_other:
        print()
        print(
            causes(
                [(n, f"Mac {real}", got) for n, real, got in verdicts.caught_other],
                "caught with another type",
            )
        )
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(verdicts.__dict__, indent=1), encoding="utf-8")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
