"""`sample` on the command line: it says what it loaded and ignores nothing given."""

import io
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.sample import sample
from {{ cookiecutter.package_name }}.train import train


@pytest.fixture
def out_dir(small_config) -> Path:
    """A 3-iteration run's out_dir."""
    train(replace(small_config, max_iters=3), stream=io.StringIO())
    return Path(small_config.out_dir)


def test_sample_says_which_checkpoint_and_iteration_it_loaded(out_dir, capsys):
    code = main(["sample", f"--out_dir={out_dir}", "--device=cpu",
                 "--max_new_tokens=5", "--num_samples=1"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"sampling from {out_dir / 'ckpt.pt'}: iteration 3 of max_iters=3" in err
    assert "-" * 40 in out and "sampling from" not in out  # stdout: samples only


def test_sample_refuses_a_training_setting_it_would_ignore(out_dir, capsys):
    code = main(["sample", f"--out_dir={out_dir}", "--device=cpu", "--n_layer=12",
                 "--learning_rate=0.5"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "it would ignore --learning_rate=0.5 (the checkpoint's: 0.001)" in err
    assert "--n_layer=12 (the checkpoint's: 2)" in err


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_sampling_shows_its_progress_on_a_terminal(out_dir, small_config):
    terminal = Terminal()
    cfg = replace(small_config, max_new_tokens=20, num_samples=2)
    sample(cfg, stream=io.StringIO(), progress=terminal)
    shown = terminal.getvalue()
    assert "sampling from" in shown  # the log line goes to the same stream
    assert "\rsample 1/2 [" in shown and "\rsample 2/2 [" in shown
    assert "/20 tokens" in shown
