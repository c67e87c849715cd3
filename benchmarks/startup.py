"""What pytest-mps adds to every pytest start-up, measured side by side in one run.

A one-test suite that never imports torch runs in fresh processes, bytecode
cached, in pairs that interleave the configurations (so drift on a noisy
machine hits all of them alike):

- ``plain``: pytest as installed, pytest-mps active;
- ``no mps``: the same with ``-p no:mps``;
- ``no benchmark`` (with ``--reference``): with ``-p no:benchmark``
  (pytest-benchmark's own cost, for reference, when it is installed).

Each pair runs every configuration ``--repeat`` times, alternating, and keeps
each one's fastest run: on a shared machine a run is only ever slowed down,
so the fastest of a few is the start-up itself, and the pair's difference
moves far less than one of single runs (on a 2-core VM whose single runs
spread over 370-680 ms, single-run pairs of 31 read from -3 to +48 ms for
the same code). It prints each configuration's median wall time and the
median of the paired differences against ``plain``. The goal for pytest-mps
is a paired median difference of at most 15 ms over at least 30 pairs.

It also prints the same figures in CPU time (the pytest process's user and
system time, its children's included, from ``getrusage``): start-up is
CPU-bound, so on a quiet machine the two agree, while on a shared one the
wall clock also counts the time the process waited for a core.

By default it measures pytest-mps as users get it: this checkout built and
installed from a wheel into a temporary venv (which sees the running venv's
packages through a ``.pth`` line, not its editable install). The difference
matters: pytest rewrites the asserts of every module of a ``pytest11``
distribution, and an editable install lists none of its modules, so measuring
one under-reads what a wheel's user pays (it read 46 million instructions
where the wheel read 96, before the start-up modules bypassed the rewrite
hook). ``--install current`` measures the running interpreter's install.

``--dont-write-bytecode`` runs pytest with ``PYTHONDONTWRITEBYTECODE=1``, as
many container images set it: there pytest cannot cache the modules it
rewrites, and parses and rewrites them again at every start.

``--instructions`` also counts the instructions each configuration's pytest
process runs, under ``valgrind --tool=callgrind`` (Debian's valgrind): a count
that does not move with the machine's load, for steering work whose effect is
smaller than the noise, and that count in ms at the rate pytest itself ran
(pytest's instructions per ms of its CPU time). It counts with Python's
garbage collector off: where a collection falls moves with every object
allocated before it, by millions of instructions.

    python benchmarks/startup.py --pairs 31
    python benchmarks/startup.py --pairs 31 --instructions
    python benchmarks/startup.py --install current
    python benchmarks/startup.py --dont-write-bytecode
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "def test_one():\n    assert 1 + 1 == 2\n"


# Bytecode cached, as on a user's machine: without the cache every start
# compiles (and pytest rewrites the asserts of) every plugin module again. A
# fixed hash seed keeps the instruction count the same from run to run.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONHASHSEED"] = "0"


#: The interpreter whose pytest is measured (a wheel venv's, by default).
PYTHON = [sys.executable]


#: pytest with Python's cyclic garbage collector off, for counting instructions:
#: where a collection falls moves with every object allocated before it, and a
#: plugin with one hook more read 4 million instructions more with it on (0.3
#: with it off).
NO_GC = (
    "import gc, sys; gc.disable(); sys.argv[0] = 'pytest'; import pytest;"
    " sys.exit(pytest.console_main())"
)


def command(extra: list[str], gc_off: bool = False) -> list[str]:
    start = ["-c", NO_GC] if gc_off else ["-m", "pytest"]
    return [PYTHON[0], *start, "-q", "-p", "no:cacheprovider", *extra]


def wheel_venv(folder: Path) -> str:
    """A venv holding this checkout's wheel; the rest comes from the running venv.

    Returns its interpreter. The running venv's site-packages are added by a
    ``.pth`` line, so its packages (pytest, its plugins) import, but its own
    ``.pth`` files, an editable install's finder among them, do not run.
    """
    root = Path(__file__).resolve().parent.parent
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "running_venv.pth").write_text("\n".join(site.getsitepackages()))
    print("building and installing this checkout's wheel...", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    subprocess.run(
        [*pip, "--no-build-isolation", "--target", purelib, root],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(python)


def cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_once(folder: Path, extra: list[str]) -> tuple[float, float]:
    """One pytest process: its wall time and its CPU time, in seconds."""
    cpu = cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(
        command(extra), cwd=folder, capture_output=True, text=True, env=ENV
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        shown = " ".join(command(extra))
        raise SystemExit(f"{shown} failed:\n{done.stdout}{done.stderr}")
    return elapsed, cpu_of_children() - cpu


def instructions(folder: Path, extra: list[str]) -> int:
    """The instructions pytest's own process runs (not its children's), GC off."""
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        f"--log-file={folder / 'callgrind-%p.log'}",
    ]
    done = subprocess.run(
        [*valgrind, *command(extra, gc_off=True)],
        cwd=folder,
        capture_output=True,
        env=ENV,
    )
    if done.returncode != 0:
        raise SystemExit(f"valgrind {' '.join(command(extra))} failed")
    counts = {}
    for log in folder.glob("callgrind-*.log"):
        text = log.read_text()
        log.unlink()
        found = re.search(r"Collected : (\d+)", text)
        if found:
            counts[int(log.stem.split("-")[1])] = int(found.group(1))
    return counts[min(counts)]  # the lowest pid: the process valgrind started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", "--rounds", type=int, default=31, dest="pairs")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--install", choices=("wheel", "current"), default="wheel")
    parser.add_argument(
        "--dont-write-bytecode",
        action="store_true",
        help="run pytest with PYTHONDONTWRITEBYTECODE=1, as many container images"
        " do: the wheel's own bytecode (compiled by pip) is read, but pytest"
        " cannot cache the modules it rewrites",
    )
    args = parser.parse_args()
    if args.dont_write_bytecode:
        ENV["PYTHONDONTWRITEBYTECODE"] = "1"
    if args.pairs < 1 or args.repeat < 1:
        parser.error("--pairs and --repeat must be at least 1")
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (apt-get install valgrind)")

    configs: dict[str, list[str]] = {"plain": [], "no mps": ["-p", "no:mps"]}
    if args.reference and importlib.util.find_spec("pytest_benchmark") is not None:
        configs["no benchmark"] = ["-p", "no:benchmark"]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.install == "wheel":
            PYTHON[0] = wheel_venv(folder)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_one.py").write_text(SUITE)
        for extra in configs.values():  # compile and cache bytecode first
            run_once(folder, extra)
        # per configuration, per pair: the fastest run's wall time, and the
        # least CPU time of the same runs
        times: dict[str, list[float]] = {name: [] for name in configs}
        cpus: dict[str, list[float]] = {name: [] for name in configs}
        started = time.perf_counter()
        for pair in range(args.pairs):
            fastest = {name: float("inf") for name in configs}
            least = {name: float("inf") for name in configs}
            for repeat in range(args.repeat):
                order = list(configs)
                if (pair + repeat) % 2:
                    order.reverse()
                for name in order:
                    wall, cpu = run_once(folder, configs[name])
                    fastest[name] = min(fastest[name], wall)
                    least[name] = min(least[name], cpu)
            for name in configs:
                times[name].append(fastest[name])
                cpus[name].append(least[name])
            each = (time.perf_counter() - started) / (pair + 1)
            left = each * (args.pairs - pair - 1)
            print(
                f"pair {pair + 1}/{args.pairs}, about {left:.0f} s left",
                end="\r",
                file=sys.stderr,
            )
        counted = {}
        if args.instructions:
            counted = {name: instructions(folder, x) for name, x in configs.items()}

    installed = {
        "wheel": "this checkout's wheel in a temporary venv",
        "current": f"the install {sys.executable} imports",
    }[args.install]
    print(
        f"pytest start-up, one test: {args.pairs} interleaved pairs, the fastest "
        f"of {args.repeat} runs of each configuration in each; pytest-mps from "
        f"{installed}"
        + ("; PYTHONDONTWRITEBYTECODE=1" if args.dont_write_bytecode else "")
    )
    print(
        f"{'configuration':<14} {'median ms':>10} {'plain minus this, ms':>22}"
        f" {'CPU ms':>8} {'plain minus this':>17}"
    )
    for name in configs:
        print(
            f"{name:<14} {median_ms(times[name]):>10.1f}"
            f" {paired_ms(times, name):>22} {median_ms(cpus[name]):>8.1f}"
            f" {paired_ms(cpus, name):>17}"
        )
    if counted:
        print(f"{'configuration':<14} {'instructions':>14} {'plain minus this':>18}")
        for name, count in counted.items():
            diff = "" if name == "plain" else f"{counted['plain'] - count:+,}"
            print(f"{name:<14} {count:>14,} {diff:>18}")
        # The instructions in time: at the rate pytest without pytest-mps ran
        # here (its instructions per ms of its median CPU time). A figure that
        # moves only with the machine's speed, not with its load.
        rate = counted["no mps"] / median_ms(cpus["no mps"])
        added = (counted["plain"] - counted["no mps"]) / rate
        print(
            f"the instructions pytest-mps adds take about {added:.1f} ms at the"
            f" rate pytest itself ran here ({rate / 1e6:.2f} million per CPU ms)"
        )
    print(
        f"pytest-mps adds {paired_ms(times, 'no mps')} ms of wall time (paired"
        f" median; goal <= 15 ms) and {paired_ms(cpus, 'no mps')} ms of CPU time"
    )


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def paired_ms(values: dict[str, list[float]], name: str) -> str:
    """The median of ``plain`` minus ``name``, pair by pair, in ms ("" for plain)."""
    if name == "plain":
        return ""
    paired = [p - v for p, v in zip(values["plain"], values[name], strict=True)]
    return f"{statistics.median(paired) * 1e3:+.1f}"


if __name__ == "__main__":
    main()
