"""The generated project under torchrun: 2 gloo processes on the CPU.

Every run is a subprocess (torchrun starts its own workers), with one thread per
process and a 2-layer, 32-wide model: each launch takes a few seconds on 2 cores.
The batch streams are split by micro-batch slot, so 2 processes with one
micro-batch each see exactly the batches one process sees with two; without
dropout their losses agree to float rounding.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("cookiecutter.main")
torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch has no torch.distributed", allow_module_level=True)

PACKAGE = "tiny_gpt"
SMALL = {
    "device": "cpu",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "batch_size": 8,
    "gradient_accumulation_steps": 2,
    "max_iters": 6,
    "lr_decay_iters": 6,
    "warmup_iters": 2,
    "learning_rate": 3e-3,
    "log_interval": 1,
    "eval_interval": 3,
    "eval_iters": 2,
    "dropout": 0.0,
    "compile": "false",
    "plot": "false",
}
LOSS = re.compile(r"^iter (\d+): loss ([\d.]+)", re.M)
EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", re.M)


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory, bake: Callable[..., Path]
) -> Path:
    baked = bake(tmp_path_factory.mktemp("ddp"))
    launch(baked, [], "prepare")
    return baked


def run_env(project: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(project / "src"),
        # torchrun's log folders (torchelastic_*) and anything else a run leaves
        # in the temporary folder go beside the project, in pytest's tmp.
        "TMPDIR": str(project.parent / "tmp"),
    }
    (project.parent / "tmp").mkdir(exist_ok=True)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def readme_torchrun() -> list[str]:
    """README.md's torchrun command: `torchrun ... -m tiny_gpt train`, as words."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"`(torchrun [^`]*)`", readme)
    return command.split()


def runner(ranks: int) -> list[str]:
    """What comes before `-m tiny_gpt COMMAND`: python, or the README's torchrun
    with N processes (`python -m torch.distributed.run` is `torchrun`'s entry point,
    run by this interpreter)."""
    if ranks == 1:
        return [sys.executable]
    options = readme_torchrun()[1 : readme_torchrun().index("-m")]
    options = [o.replace("=N", f"={ranks}") for o in options]
    return [sys.executable, "-m", "torch.distributed.run", *options]


def test_the_readme_torchrun_command_is_the_one_run_here() -> None:
    assert readme_torchrun()[-3:] == ["-m", PACKAGE, "train"]
    assert runner(2)[3:] == ["--standalone", "--nproc_per_node=2"]


def launch(project: Path, args: list[str], command: str = "train", ranks: int = 1):
    env = run_env(project)
    done = subprocess.run(
        [*runner(ranks), "-m", PACKAGE, command, *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def train(project: Path, out: str, ranks: int, **changes) -> str:
    settings = {**SMALL, **changes, "out_dir": out}
    return launch(project, [f"--{k}={v}" for k, v in settings.items()], ranks=ranks)


def losses(output: str) -> dict[int, float]:
    return {int(it): float(loss) for it, loss in LOSS.findall(output)}


def test_two_processes_match_one_at_the_same_global_batch(project: Path) -> None:
    one = train(project, "one", ranks=1)
    two = train(project, "two", ranks=2)
    assert "2 DDP processes, 1 micro-batch(es) each" in two
    assert "512 tokens per iteration" in one and "512 tokens per iteration" in two
    single, ddp = losses(one), losses(two)
    assert sorted(single) == sorted(ddp) == [0, 1, 2, 3, 4, 5]  # step indices
    for it in single:
        assert ddp[it] == pytest.approx(single[it], abs=2e-4), (it, one, two)
    assert single[5] < single[0] - 0.2  # it trained, in both
    # Rank 0 alone evaluates and prints: each evaluation once, the same values.
    assert EVAL.findall(two) == EVAL.findall(one)
    assert [int(s) for s, _ in EVAL.findall(two)] == [0, 3, 6]
    assert two.count("checkpoint:") == 1
    files = sorted(p.name for p in (project / "two").iterdir())
    assert files == ["ckpt.pt", "loss.csv"], files  # no rank's leftovers
    state = torch.load(project / "two" / "ckpt.pt", weights_only=True)
    assert state["written_by_rank"] == 0 and state["world_size"] == 2
    assert sorted(state["batches"]) == [0, 1]  # both ranks' batch streams
    assert len(state["rng_by_rank"]) == 2


def test_a_ddp_run_resumes_exactly_where_it_stopped(project: Path) -> None:
    # Dropout on: each rank's restored random state matters, not only the batches.
    whole = losses(train(project, "whole", ranks=2, dropout=0.1))
    train(project, "split", ranks=2, dropout=0.1, max_iters=3)
    # Going on past the first run's max_iters is a change resuming must allow.
    resumed = train(project, "split", ranks=2, dropout=0.1, init_from="resume",
                    allow_changes="max_iters")  # fmt: skip
    assert "resumed from split/ckpt.pt at iteration 3" in resumed
    after = losses(resumed)
    assert sorted(after) == [3, 4, 5]
    assert after == {it: whole[it] for it in (3, 4, 5)}, (after, whole)


def test_ctrl_c_under_torchrun_checkpoints_every_ranks_streams(project: Path) -> None:
    # The terminal sends SIGINT to the whole foreground group, torchrun and its
    # workers (torchrun passes it on to them as well). The ranks agree to stop
    # at a log step, and rank 0 saves both ranks' batch streams.
    pytest.importorskip("fcntl", reason="POSIX process groups and pipes")
    import fcntl

    settings = {**SMALL, "max_iters": 400, "lr_decay_iters": 400,
                "eval_interval": 1000, "out_dir": "stopped"}  # fmt: skip
    run = subprocess.Popen(
        [*runner(2), "-m", PACKAGE, "train",
         *(f"--{k}={v}" for k, v in settings.items())],
        cwd=project, env=run_env(project), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, bufsize=0, start_new_session=True,
    )  # fmt: skip
    if hasattr(fcntl, "F_SETPIPE_SZ"):  # the run can only get a page ahead
        fcntl.fcntl(run.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
    try:
        seen = b""
        while not re.search(rb"^iter ([5-9]|\d\d+):", seen, re.M):
            line = run.stdout.readline()
            assert line, seen.decode()
            seen += line
        os.killpg(run.pid, signal.SIGINT)
        rest, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    out = (seen + rest).decode()
    stopped = re.search(r"stopped by SIGINT at iteration (\d+) of 400", out)
    assert stopped, out
    state = torch.load(project / "stopped" / "ckpt.pt", weights_only=True)
    assert state["iter_num"] == int(stopped.group(1)) < 400
    assert state["world_size"] == 2 and sorted(state["batches"]) == [0, 1]
    assert out.count("stopped by SIGINT") == 1  # rank 0 alone reports


def test_target_val_loss_stops_every_rank_at_the_same_iteration(project: Path) -> None:
    # Rank 0 alone evaluates; a rank that went on would wait for the others in
    # its next step's gradient average until the launch timed out.
    out = train(project, "target", ranks=2, max_iters=300, lr_decay_iters=300,
                target_val_loss=3.9)  # fmt: skip
    stopped = re.search(
        r"stopped at iteration (\d+) of 300: val loss ([\d.]+) reached"
        r" target_val_loss=3.9",
        out,
    )
    assert stopped, out
    at = int(stopped.group(1))
    assert float(stopped.group(2)) <= 3.9 and 0 < at < 300
    assert [int(s) for s, _ in EVAL.findall(out)] == list(range(0, at + 1, 3))
    assert max(losses(out)) == at - 1  # no step after the stop, on rank 0 either
    state = torch.load(project / "target" / "ckpt.pt", weights_only=True)
    assert state["iter_num"] == at and state["world_size"] == 2
