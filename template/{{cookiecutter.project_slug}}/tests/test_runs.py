"""What `train` may do to out_dir, tried as a user would: on the command line."""

import csv
import io
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import parse_args
from {{ cookiecutter.package_name }}.train import train

SMALL = {
    "preset": "tiny",  # whichever preset the project was baked with
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "batch_size": 8,
    "max_iters": 4,
    "warmup_iters": 2,
    "eval_interval": 1000,
    "eval_iters": 2,
    "log_interval": 1,
    "device": "cpu",
    "dtype": "float32",
    "compile": "false",
    "plot": "false",
}


def flags(data_dir: Path, out_dir: Path, **changes) -> list[str]:
    settings = {**SMALL, "data_dir": data_dir, "out_dir": out_dir, **changes}
    return [f"--{key}={value}" for key, value in settings.items()]


@pytest.fixture
def cli(capsys):
    """Run the command line; its exit code, stdout and stderr."""

    def run(*args) -> tuple[int, str, str]:
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def trained(cli, data_dir, tmp_path) -> Path:
    """out_dir of a finished 4-iteration run."""
    out = tmp_path / "out"
    code, _, err = cli("train", *flags(data_dir, out))
    assert code == 0, err
    return out


def test_training_again_into_the_same_out_dir_is_refused_and_keeps_the_checkpoint(
    cli, data_dir, trained
):
    before = (trained / "ckpt.pt").read_bytes()
    code, out, err = cli("train", *flags(data_dir, trained, max_iters=1, dtype="auto"))
    assert code == 2 and out == ""
    assert f"{trained / 'ckpt.pt'} holds an earlier run (iteration 4 of" in err
    for way_out in ("--init_from=resume", "--out_dir=NEW_FOLDER", "--overwrite=true"):
        assert way_out in err
    assert (trained / "ckpt.pt").read_bytes() == before


def test_overwrite_replaces_the_earlier_run_and_says_so(cli, data_dir, trained):
    code, out, err = cli("train", *flags(data_dir, trained, max_iters=2),
                         "--overwrite=true")  # fmt: skip
    assert code == 0, err
    assert f"removed the earlier run in {trained} (iteration 4 of" in out
    assert checkpoint.load(trained / "ckpt.pt")["iter_num"] == 2


def test_resuming_with_other_settings_names_each_difference_and_trains_nothing(
    cli, data_dir, trained
):
    before = (trained / "ckpt.pt").read_bytes()
    code, out, err = cli("train", "--init_from=resume", f"--out_dir={trained}",
                         "--max_iters=8", "--n_layer=3",
                         "--learning_rate=0.002")  # fmt: skip
    assert code == 2 and "iter " not in out
    assert "n_layer: 2 in the checkpoint, 3 asked for (the model's shape" in err
    assert "max_iters: 4 in the checkpoint, 8 asked for" in err
    assert "learning_rate: 0.001 in the checkpoint, 0.002 asked for" in err
    assert "learning rate decays over 4 steps in the checkpoint, 8 asked" in err
    assert "--allow_changes=max_iters,learning_rate,lr_decay_iters" in err
    assert (trained / "ckpt.pt").read_bytes() == before


def test_resuming_with_no_settings_continues_the_run_as_it_was(cli, trained):
    # Every setting, data_dir included, comes from the checkpoint.
    code, out, err = cli("train", "--init_from=resume", f"--out_dir={trained}")
    assert code == 0, err
    assert f"resumed from {trained / 'ckpt.pt'} at iteration 4" in out
    assert "the run is complete (iteration 4 of max_iters=4)" in out


def test_training_on_past_max_iters_needs_allow_changes_and_keeps_the_schedule(
    cli, trained
):
    resume = ("train", "--init_from=resume", f"--out_dir={trained}", "--max_iters=6")
    code, _, err = cli(*resume, "--allow_changes=max_iters")
    assert code == 2 and "--lr_decay_iters=4 keeps the schedule" in err
    code, out, err = cli(*resume, "--allow_changes=max_iters", "--lr_decay_iters=4")
    assert code == 0, err
    assert "changed on resuming (--allow_changes): max_iters 4 -> 6" in out
    state = checkpoint.load(trained / "ckpt.pt")
    assert state["iter_num"] == 6 and state["config"]["lr_decay_iters"] == 4


def test_an_out_dir_that_cannot_be_written_fails_at_once_in_one_line(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # No dataset there either: the out_dir check comes before any loading.
    code, out, err = cli("train", f"--out_dir={blocker / 'out'}",
                         f"--data_dir={tmp_path / 'nothing'}")  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--out_dir={blocker / 'out'}: cannot write there" in err
    assert not (tmp_path / "nothing").exists()


def test_the_log_and_loss_csv_give_the_same_iteration_numbers(cli, data_dir, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = cli("train", *flags(data_dir, out_dir, max_iters=7,
                                         log_interval=3))  # fmt: skip
    assert code == 0, err
    logged = [int(n) for n in re.findall(r"^iter (\d+): loss", out, re.M)]
    with open(out_dir / "loss.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["train_loss"]]
    assert logged == [int(row["iter"]) for row in rows] == [0, 3, 6]


def test_loss_csv_lists_each_iteration_once_in_order(cli, data_dir, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = cli("train", *flags(data_dir, out_dir, max_iters=7,
                                         log_interval=3, eval_interval=3))  # fmt: skip
    assert code == 0, err
    with open(out_dir / "loss.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # Logged at 0, 3, 6; evaluated at 0, 3, 6 and at the end, 7.
    assert [int(row["iter"]) for row in rows] == [0, 3, 6, 7]
    logged = dict(re.findall(r"^iter (\d+): loss ([\d.]+)", out, re.M))
    evaluated = dict(re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)",
                                out, re.M))  # fmt: skip
    for row in rows:
        it = row["iter"]
        assert (f"{float(row['train_loss']):.4f}" if row["train_loss"] else None) == (
            logged.get(it)
        )
        assert f"{float(row['eval_val_loss']):.4f}" == evaluated[it]


class CtrlCAfter(io.StringIO):
    """A training log that presses Ctrl-C once iteration `at` is logged."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def write(self, text: str) -> int:
        if text.startswith(f"iter {self.at}:"):
            os.kill(os.getpid(), signal.SIGINT)  # the run saves after this step
        return super().write(text)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_resuming_a_checkpoint_saved_between_evaluations_names_its_evaluation(
    cli, data_dir, tmp_path
):
    out_dir = tmp_path / "out"
    log = CtrlCAfter(2)
    stopped = train(parse_args(flags(data_dir, out_dir, max_iters=8)), stream=log)
    assert stopped.stopped_by == "SIGINT" and 2 < stopped.iter_num < 8
    step_0 = re.search(r"^step 0: train loss [\d.]+, val loss ([\d.]+)$",
                       log.getvalue(), re.M)[1]  # fmt: skip
    code, out, err = cli("train", "--init_from=resume", f"--out_dir={out_dir}")
    assert code == 0, err
    it = stopped.iter_num
    # The checkpoint's last evaluation is step 0's, and says so.
    assert (
        f"resumed from {out_dir / 'ckpt.pt'} at iteration {it} (iteration {it} of"
        f" max_iters=8, preset 'tiny', dataset 'shakespeare_char', val loss {step_0}"
        " at iteration 0)\n"
    ) in out


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_resuming_names_the_checkpoints_last_evaluation_not_the_first(
    cli, data_dir, tmp_path
):
    out_dir = tmp_path / "out"
    log = CtrlCAfter(5)
    cfg = parse_args(flags(data_dir, out_dir, max_iters=12, eval_interval=2))
    stopped = train(cfg, stream=log)
    assert stopped.stopped_by == "SIGINT"
    evals = re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)$",
                       log.getvalue(), re.M)  # fmt: skip
    at, val = evals[-1]
    assert int(at) >= 4  # evaluations after step 0 happened before the stop
    assert val != evals[0][1]
    code, out, err = cli("train", "--init_from=resume", f"--out_dir={out_dir}")
    assert code == 0, err
    it = stopped.iter_num
    when = "" if int(at) == it else f" at iteration {at}"
    described = f"dataset 'shakespeare_char', val loss {val}{when})"
    assert f"max_iters=12, preset 'tiny', {described}" in out


def test_a_nan_learning_rate_is_blamed_on_learning_rate(cli):
    code, _, err = cli("train", "--learning_rate=nan")
    assert code == 2
    assert "learning_rate=nan (--learning_rate=nan on the command line)" in err
    assert "min_lr" not in err
