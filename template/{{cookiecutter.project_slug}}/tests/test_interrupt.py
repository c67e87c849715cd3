"""Stopping a run from outside: Ctrl-C, SIGTERM, and a hard kill, on the CPU.

Each run is a real `python -m {{ cookiecutter.package_name }} train` process. The test
reads the run's log through a pipe shrunk to one page (4096 bytes, at most ~120
lines of `iter N: ...`), so the run can print, and so train, at most ~120 steps
ahead of the reader: a signal sent after `iter 5` reaches it before the end of
its 200 steps, whatever the load on the machine. Where pipes cannot be shrunk
(macOS), the runs are made longer.
"""

import csv
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

fcntl = pytest.importorskip("fcntl", reason="POSIX signals and pipes")

from {{ cookiecutter.package_name }} import checkpoint  # noqa: E402
from {{ cookiecutter.package_name }}.cli import main  # noqa: E402

PACKAGE = checkpoint.__name__.split(".")[0]
PACED = hasattr(fcntl, "F_SETPIPE_SZ")
MAX_ITERS = 200 if PACED else 3000
# Dropout and two micro-batches per step: the resumed run must restore the
# random state and every batch stream, not only the weights.
SMALL = {
    "preset": "tiny",  # whichever preset the project was baked with
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "batch_size": 8,
    "gradient_accumulation_steps": 2,
    "dropout": 0.1,
    "max_iters": MAX_ITERS,
    "warmup_iters": 10,
    "eval_interval": 10_000,  # evaluations at the start and the end only
    "eval_iters": 2,
    "log_interval": 1,
    "device": "cpu",
    "dtype": "float32",
    "compile": "false",
    "plot": "false",
}
STOPPED = re.compile(
    r"stopped by (\w+) at iteration (\d+) of \d+: checkpoint (\S+); resume with `(.+)`"
)


def flags(data_dir: Path, out_dir: Path, **changes) -> list[str]:
    settings = {**SMALL, "data_dir": data_dir, "out_dir": out_dir, **changes}
    return [f"--{key}={value}" for key, value in settings.items()]


def env() -> dict[str, str]:
    # One thread in every run: the same arithmetic, so runs compare bit for bit.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", PACKAGE, *args]


def start(args: list[str]) -> subprocess.Popen:
    """A run whose log comes through a one-page pipe, read line by line."""
    run = subprocess.Popen(
        command(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env(),
        bufsize=0,  # unbuffered: the reader holds back nothing the run wrote
        # A shell's background job ignores SIGINT, and so would its children.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    if PACED:
        fcntl.fcntl(run.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
    return run


def wait_for_iteration(run: subprocess.Popen, at_least: int) -> str:
    seen = []
    for raw in iter(run.stdout.readline, b""):
        line = raw.decode()
        seen.append(line)
        found = re.match(r"iter (\d+):", line)
        if found and int(found.group(1)) >= at_least:
            return "".join(seen)
    raise AssertionError(f"the run ended before iteration {at_least}:\n{seen}")


def finished(args: list[str]) -> str:
    done = subprocess.run(
        command(args), capture_output=True, text=True, env=env(), timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def stop_with(sig: int, data_dir: Path, out_dir: Path) -> tuple[str, int]:
    """Start a run, send `sig` after iteration 5; its output and exit code."""
    run = start(["train", *flags(data_dir, out_dir)])
    try:
        before = wait_for_iteration(run, 5)
        run.send_signal(sig)
        after, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return before + after.decode(), run.returncode


def test_ctrl_c_saves_a_checkpoint_and_resuming_matches_an_uninterrupted_run(
    data_dir, tmp_path
):
    # The uninterrupted run goes on meanwhile, in a process of its own.
    whole_run = subprocess.Popen(
        command(["train", *flags(data_dir, tmp_path / "whole")]),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env(),
    )  # fmt: skip
    try:
        out, code = stop_with(signal.SIGINT, data_dir, tmp_path / "stopped")
    except BaseException:
        whole_run.kill()
        whole_run.wait()
        raise
    assert code == 130, out
    stopped = STOPPED.search(out)
    assert stopped, out
    name, at, path, resume = stopped.groups()
    assert name == "SIGINT" and 5 < int(at) < MAX_ITERS, out
    assert checkpoint.load(Path(path))["iter_num"] == int(at)
    assert not list((tmp_path / "stopped").glob(".*tmp*"))  # written atomically

    # The command it printed, as the user would type it.
    program, *args = resume.split()
    assert program == "{{ cookiecutter.project_slug }}" and "--init_from=resume" in args
    # Where it ran: machine settings never come from a checkpoint, so a run
    # stopped on the CPU must not resume on a GPU that `auto` would pick.
    assert {"--device=cpu", "--dtype=float32", "--compile=false"} <= set(args)
    resumed = finished(args)
    assert f"resumed from {path} at iteration {at}" in resumed

    _, errors = whole_run.communicate(timeout=300)
    assert whole_run.returncode == 0, errors.decode()[-3000:]
    # every step's loss and both evaluations, digit for digit (not the clock)
    assert without_clock(tmp_path / "stopped") == without_clock(tmp_path / "whole")
    end = checkpoint.load(Path(path))
    whole = checkpoint.load(tmp_path / "whole" / "ckpt.pt")
    assert end["iter_num"] == whole["iter_num"] == MAX_ITERS
    for key, tensor in whole["model"].items():
        assert torch.equal(end["model"][key], tensor), key


def test_sigterm_saves_a_checkpoint_and_says_how_to_resume(data_dir, tmp_path):
    out, code = stop_with(signal.SIGTERM, data_dir, tmp_path / "out")
    assert code == 128 + signal.SIGTERM, out
    stopped = STOPPED.search(out)
    assert stopped and stopped.group(1) == "SIGTERM", out
    state = checkpoint.load(tmp_path / "out" / "ckpt.pt")
    assert 5 < state["iter_num"] == int(stopped.group(2)) < MAX_ITERS


def test_a_newer_run_killed_before_its_first_checkpoint_is_never_resumed_as_the_older(
    data_dir, tmp_path, capsys
):
    out = tmp_path / "out"
    assert main(["train", *flags(data_dir, out, max_iters=4)]) == 0
    assert checkpoint.load(out / "ckpt.pt")["iter_num"] == 4
    # A new, longer run over it, killed outright before it checkpoints.
    run = start(["train", *flags(data_dir, out, overwrite="true")])
    try:
        wait_for_iteration(run, 0)
    finally:
        run.kill()
        run.wait()
    capsys.readouterr()
    assert main(["train", "--init_from=resume", f"--out_dir={out}"]) == 1
    assert "no checkpoint at" in capsys.readouterr().err
    assert not (out / "ckpt.pt").exists()  # the older run's was removed, as asked


def without_clock(out_dir):
    """loss.csv's rows without elapsed_s, which no two runs share."""
    with open(out_dir / "loss.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(row.pop("elapsed_s") for row in rows)
    return rows
