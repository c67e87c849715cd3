"""Progress while training: an ETA, evaluations shown, a preset too large named."""

import io

from {{ cookiecutter.package_name }} import progress as progress_module
from {{ cookiecutter.package_name }}.config import PRESETS, replace
from {{ cookiecutter.package_name }}.progress import Bar, Task, duration
from {{ cookiecutter.package_name }}.train import train
from {{ cookiecutter.package_name }}.train_progress import (
    SIZE_SETTINGS,
    Progress,
    size_warning,
)
from {{ cookiecutter.package_name }}.trainer import setup


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_training_bar_shows_the_time_left():
    terminal = Terminal()
    progress = Progress(total=10**9, stream=terminal)
    progress.update(0, loss=4.0, ms=10.0, mfu=None)
    progress.update(10, loss=3.5, ms=10.0, mfu=None)
    progress.close()
    first, second = terminal.getvalue().split("\r")[1:]
    assert "ETA" not in first  # no pace known yet
    assert "10/1000000000 loss 3.5000 10.0 ms/iter, ETA " in second


def test_an_evaluations_eta_leaves_out_its_first_batch(monkeypatch):
    """The first batch carries compilation: the pace is read from the second on."""
    clock = iter([0.0, 16.0, 16.1, 16.2])  # start, then batches 1, 2, 3
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    task = Task(Bar(Terminal()), "step 0: evaluating", 40, "batches")
    assert task.left(0, 0.0) is None
    task.advance(1)
    assert task.left(1, 16.0) is None  # one batch: compile and all, no pace yet
    task.advance(2)
    # 0.1 s a batch since the first, 38 to go: not 16 s a batch (10 minutes)
    assert abs(task.left(3, 16.2) - 0.2 / 2 * 37) < 1e-9


def test_a_slow_step_reads_in_seconds():
    lines = io.StringIO()
    progress = Progress(total=100, stream=lines)
    progress.update(1, loss=4.0, ms=17349.4, mfu=None)
    progress.update(2, loss=3.9, ms=999.9, mfu=None)
    first, second = lines.getvalue().splitlines()
    assert first.startswith("iter 1: loss 4.0000, 17.3 s/iter")
    assert second.startswith("iter 2: loss 3.9000, 999.9 ms/iter")


def test_durations_read_as_a_person_would_say_them():
    seconds = (0.4, 45, 192, 7500)
    assert [duration(s) for s in seconds] == ["0s", "45s", "3m12s", "2h05m"]


def test_an_evaluation_shows_its_progress_on_a_terminal(small_config):
    terminal = Terminal()
    train(replace(small_config, max_iters=2, eval_iters=3), stream=terminal)
    shown = terminal.getvalue()
    assert "\rstep 0: evaluating [" in shown and " batches" in shown
    assert "step 2: train loss" in shown


def test_a_preset_far_too_large_for_the_device_is_named_with_the_measured_time(
    small_config,
):
    shape = {n: PRESETS["shakespeare_char"][n] for n in SIZE_SETTINGS}
    t = setup(replace(small_config, preset="shakespeare_char", max_iters=100,
                      eval_interval=50, eval_iters=10, **shape),
              log=lambda _: None)  # fmt: skip
    warning = size_warning(t, batch_seconds=2.0)
    assert warning is not None
    assert "preset 'shakespeare_char' is far too large for" in warning
    assert "one evaluation batch took 2.00 s here" in warning
    # 3 forward passes a step; evaluations at 0, 50, 100 of 20 batches each.
    assert "a training step takes about 6s" in warning
    assert "(100 iterations, 3 evaluations of 20 batches) about 12m00s" in warning
    assert "--preset=tiny suits this device" in warning
    assert "fewer --max_iters (now 100)" in warning
    assert size_warning(t, batch_seconds=0.01) is None


def test_a_short_run_is_not_warned_about_however_slow_its_steps(small_config):
    # the README's main job: 100 iterations of tiny on a slow CPU take minutes
    t = setup(replace(small_config, preset="tiny", max_iters=100,
                      eval_interval=50, eval_iters=10), log=lambda _: None)  # fmt: skip
    assert size_warning(t, batch_seconds=0.5) is None  # about 3 minutes
    assert size_warning(t, batch_seconds=3.0) is not None  # about 18 minutes


def test_a_model_sized_by_hand_is_named_instead_of_its_preset(small_config):
    t = setup(replace(small_config, preset="tiny", n_layer=2, n_embd=32,
                      max_iters=1000, eval_interval=500, eval_iters=10),
              log=lambda _: None)  # fmt: skip
    warning = size_warning(t, batch_seconds=1.0)
    assert warning is not None
    assert "warning: the model set here (" in warning and "n_layer=2" in warning
    assert "preset 'tiny'" not in warning
    assert "a smaller model suits it (now --n_layer=2 --n_embd=32" in warning
