import csv
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pytest_mps import assert_on_device, assert_same_device

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.bench import bench
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import replace
from {{ cookiecutter.package_name }}.data import prepare
from {{ cookiecutter.package_name }}.device import peak_flops
from {{ cookiecutter.package_name }}.errors import CheckpointError, ConfigError, DeviceError
from {{ cookiecutter.package_name }}.optim import lr_at
from {{ cookiecutter.package_name }}.sample import sample
from {{ cookiecutter.package_name }}.train import evaluate, train, train_step
from {{ cookiecutter.package_name }}.train_progress import Progress
from {{ cookiecutter.package_name }}.trainer import pick_compile_mode, setup

NOT_BITWISE = "GPU kernels are not bitwise reproducible; exact resume is a CPU promise"


def run(cfg):
    stream = io.StringIO()
    return train(cfg, stream=stream), stream.getvalue()


def test_after_setup_model_batch_and_optimizer_share_the_device(small_config, device):
    t = setup(small_config, log=lambda _: None)
    x, y = t.batches.next()
    train_step(t)  # the optimizer has state only after its first step
    assert_same_device(t.model, (x, y), t.optimizer)
    assert_on_device(t.model, device)


def test_a_step_runs_under_the_devices_automatic_precision(small_config, device):
    t = setup(replace(small_config, dtype="auto"), log=lambda _: None)
    assert (t.runtime.dtype == torch.float32) == (device.type == "cpu")
    losses = [train_step(t) for _ in range(2)]
    assert all(torch.isfinite(loss).item() for loss in losses)


def test_the_loss_falls_over_a_few_steps(small_config):
    cfg = replace(small_config, max_iters=40, eval_interval=40, eval_iters=8,
                  learning_rate=3e-3, warmup_iters=5)  # fmt: skip
    result, out = run(cfg)
    (_, _, val_before), (_, _, val_after) = result.evals
    assert val_after < val_before - 0.5, out
    assert result.losses[-1][1] < result.losses[0][1]
    # ms/iter, or s/iter on a machine busy enough to take a second per step
    assert "loss" in out and re.search(r"\d m?s/iter", out), out


def test_training_on_the_device_gives_the_cpus_losses(small_config, device):
    # The same batches (drawn on the CPU) and the same initial weights (made on
    # the CPU, then moved): only the device's kernels differ. No dropout, whose
    # mask the device draws with its own generator.
    cfg = replace(small_config, dropout=0.0, max_iters=12, lr_decay_iters=12)
    on_device, _ = run(cfg)
    on_cpu, _ = run(replace(cfg, device="cpu", out_dir=cfg.out_dir + "-cpu"))
    assert [it for it, _ in on_device.losses] == [it for it, _ in on_cpu.losses]
    for (it, got), (_, expected) in zip(on_device.losses, on_cpu.losses, strict=True):
        # float32 kernels of another device: a few 1e-4 apart after 12 steps
        assert abs(got - expected) < 1e-2, (it, got, expected, device)
    assert on_cpu.losses[-1][1] < on_cpu.losses[0][1]


def test_mfu_is_reported_from_the_table_or_said_to_be_unknown(small_config, device):
    _, out = run(replace(small_config, log_interval=2))
    if peak_flops(device, torch.float32) is None:  # the CPU, unlisted GPUs
        assert "MFU unknown for" in out and "s/iter, mfu" not in out
    else:
        assert re.search(r"m?s/iter, mfu \d+\.\d%", out), out


@pytest.mark.skip_device("mps", "cuda", reason=NOT_BITWISE)
def test_resuming_gives_the_same_next_losses_as_an_uninterrupted_run(small_config):
    # Dropout on, so the restored random state matters as well as the batches.
    cfg = replace(small_config, dropout=0.1, max_iters=8, lr_decay_iters=8,
                  eval_interval=3, gradient_accumulation_steps=2)  # fmt: skip
    whole, _ = run(replace(cfg, out_dir=cfg.out_dir + "-whole"))
    first, _ = run(replace(cfg, max_iters=5))
    assert first.iter_num == 5 and first.checkpoint is not None
    # Training on past the first run's max_iters is a change it must allow.
    resumed, out = run(replace(cfg, init_from="resume", allow_changes="max_iters"))
    assert "resumed from" in out
    after = [(it, loss) for it, loss in resumed.losses if it >= 5]
    assert [it for it, _ in after] == [5, 6, 7]
    assert after == [(it, loss) for it, loss in whole.losses if it >= 5]


def test_a_checkpoint_interrupted_mid_write_leaves_the_old_one(
    small_config, monkeypatch
):
    result, _ = run(replace(small_config, max_iters=2))
    path = result.checkpoint
    before = path.read_bytes()

    def killed_mid_write(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"model": {}}, path)
    assert path.read_bytes() == before
    assert not [name for name in os.listdir(path.parent) if ".tmp-" in name]
    assert checkpoint.load(path)["iter_num"] == 2


WRITER = """
import sys, torch
from PACKAGE.checkpoint import save
from pathlib import Path
for i in range(1, 10_000):
    weights = dict(w=torch.full((4_000_000,), float(i)))
    save(dict(model=weights, model_config=dict(), tokenizer=dict(), iter_num=i),
         Path(sys.argv[1]))
    print(i, flush=True)
"""


def partly_written(folder: Path, full_size: int) -> bool:
    """Whether some file in `folder` is part-way through being written."""
    for entry in os.scandir(folder):
        try:
            if entry.name.endswith(".py"):
                continue
            if 0 < entry.stat().st_size < full_size:
                return True
        except FileNotFoundError:  # renamed away between listing and stat
            pass
    return False


def test_killing_the_process_while_it_checkpoints_leaves_a_whole_file(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.replace("PACKAGE", checkpoint.__name__.split(".")[0]))
    path = tmp_path / "ckpt.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, env=env
    )
    try:
        while int(writer.stdout.readline() or 0) < 2:
            assert writer.poll() is None, "the writer died"
        full_size = path.stat().st_size
        deadline = time.monotonic() + 60
        # Kill it in the middle of writing a checkpoint, whatever file that is.
        while not partly_written(tmp_path, full_size):
            assert time.monotonic() < deadline, "never saw a save in progress"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    state = checkpoint.load(path)
    expected = torch.full((4_000_000,), float(state["iter_num"]))
    assert torch.equal(state["model"]["w"], expected)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_checkpoint_is_reported_with_its_path(small_config, damage):
    result, _ = run(replace(small_config, max_iters=2))
    path: Path = result.checkpoint
    data = path.read_bytes()
    path.write_bytes(
        b"not a checkpoint" if damage == "garbage" else data[: len(data) // 2]
    )
    with pytest.raises(CheckpointError, match=rf"{path.name} is corrupt"):
        run(replace(small_config, init_from="resume"))


def test_resuming_without_a_checkpoint_says_to_train_first(small_config):
    with pytest.raises(CheckpointError, match="no checkpoint at .*train first"):
        run(replace(small_config, init_from="resume"))


def test_sampling_continues_the_prompt_from_the_checkpoint(small_config):
    run(replace(small_config, max_iters=2))
    cfg = replace(small_config, start="ROMEO:", num_samples=2, max_new_tokens=25)
    texts = sample(cfg, stream=io.StringIO())
    assert len(texts) == 2
    assert all(t.startswith("ROMEO:") and len(t) == len("ROMEO:") + 25 for t in texts)


def test_the_command_line_trains_and_samples(small_config, capsys):
    args = [f"--{k}={v}" for k, v in small_config.to_dict().items()
            if k not in ("preset", "start")]  # fmt: skip
    assert main(["train", *args]) == 0
    assert main(["sample", *args, "--max_new_tokens=10", "--num_samples=1"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint:" in out and "-" * 40 in out


def test_the_loss_curve_is_drawn_when_matplotlib_is_installed(small_config):
    _, out = run(replace(small_config, plot=True, max_iters=2))
    png = Path(small_config.out_dir) / "loss.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out and not png.exists()
    else:
        assert png.read_bytes().startswith(b"\x89PNG")
    assert (Path(small_config.out_dir) / "loss.csv").is_file()


def test_without_matplotlib_train_says_in_one_line_how_to_get_the_plot(
    small_config, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    _, out = run(replace(small_config, plot=True, max_iters=2))
    said = [line for line in out.splitlines() if "no loss curve" in line]
    assert len(said) == 1 and "pip install -e '.[plot]'" in said[0], out
    assert not (Path(small_config.out_dir) / "loss.png").exists()
    assert (Path(small_config.out_dir) / "loss.csv").is_file()


def test_the_learning_rate_warms_up_then_decays_to_min_lr(small_config):
    cfg = replace(small_config, warmup_iters=10, max_iters=100, learning_rate=1e-3,
                  min_lr=1e-4)  # fmt: skip
    lrs = [lr_at(cfg, it) for it in range(101)]
    assert lrs[0] < lrs[5] < lrs[10]
    assert max(lrs) == pytest.approx(1e-3, rel=0.01)
    assert all(a >= b for a, b in zip(lrs[11:], lrs[12:], strict=False))
    assert lrs[100] == pytest.approx(1e-4)


def test_a_gpt2_bpe_dataset_trains_and_samples_text(small_config, tmp_path):
    text = "Shall I compare thee to a summer's day?\n" * 200
    (tmp_path / "sonnet.txt").write_text(text, encoding="utf-8")
    cfg = replace(
        small_config,
        data_dir=str(tmp_path / "data"),
        dataset="sonnet",
        input_file=str(tmp_path / "sonnet.txt"),
        tokenizer="gpt2",
        max_iters=2,
    )
    prepare(cfg, log=lambda _: None)
    result, _ = run(cfg)
    assert result.checkpoint is not None
    state = checkpoint.load(result.checkpoint)
    assert state["model_config"]["vocab_size"] == 50304  # padded for speed
    texts = sample(replace(cfg, start="Shall", max_new_tokens=5, num_samples=1),
                   stream=io.StringIO())  # fmt: skip
    assert texts[0].startswith("Shall") and len(texts[0]) > len("Shall")


def test_the_benchmark_times_training_steps_without_a_dataset(small_config):
    stream = io.StringIO()
    result = bench(replace(small_config, data_dir="nowhere", bench_iters=3), stream)
    assert result.ms_per_iter > 0 and result.tokens_per_s > 0
    assert torch.isfinite(torch.tensor(result.final_loss))
    out = stream.getvalue()
    # ms, or s on a machine busy enough to take a second per step
    assert re.search(r" m?s/iter over 3 steps", out) and "tokens/s" in out, out
    if small_config.device == "cpu":
        assert result.mfu is None and "MFU unknown" in out
        assert result.peak_memory is None and "peak memory not measured" in out
    else:
        # the figure and where it comes from: an allocator's peak, or on an
        # MPS torch without one, what the driver holds
        assert result.peak_memory > 0, out
        assert f"({result.peak_memory_source})" in out
        assert result.peak_memory_source in (
            "the allocator's peak",
            "held by the MPS driver",
        )


def test_resuming_on_a_dataset_with_another_vocabulary_is_refused(
    small_config, tmp_path
):
    run(replace(small_config, max_iters=2))
    (tmp_path / "abc.txt").write_text("abcabc" * 100, encoding="utf-8")
    other = replace(small_config, data_dir=str(tmp_path / "d"), dataset="abc",
                    input_file=str(tmp_path / "abc.txt"))  # fmt: skip
    prepare(other, log=lambda _: None)
    with pytest.raises(CheckpointError, match="another vocabulary than dataset 'abc'"):
        run(replace(other, init_from="resume"))


def test_a_prompt_can_come_from_a_file(small_config, tmp_path):
    run(replace(small_config, max_iters=2))
    (tmp_path / "prompt.txt").write_text("JULIET:\n", encoding="utf-8")
    cfg = replace(small_config, start=f"FILE:{tmp_path / 'prompt.txt'}",
                  max_new_tokens=5, num_samples=1)  # fmt: skip
    assert sample(cfg, stream=io.StringIO())[0].startswith("JULIET:\n")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_progress_is_one_redrawn_bar():
    stream = Terminal()
    progress = Progress(total=4, stream=stream)
    progress.update(2, loss=3.25, ms=12.0, mfu=None)
    progress.update(4, loss=2.5, ms=11.0, mfu=0.123)
    progress.close()
    out = stream.getvalue()
    assert out.count("\r[") == 2 and out.endswith("\n")
    assert "[###############...............] 2/4 loss 3.2500 12.0 ms/iter" in out
    assert "4/4 loss 2.5000 11.0 ms/iter, mfu 12.3%" in out


def test_cuda_graphs_are_refused_while_accumulating_gradients(small_config):
    cfg = replace(small_config, compile="true", compile_mode="reduce-overhead",
                  gradient_accumulation_steps=2)  # fmt: skip
    with pytest.raises(
        ConfigError,
        match=r"compile_mode='reduce-overhead' with gradient_accumulation_steps=2"
        r" \(2 micro-batches per process\)",
    ):
        setup(cfg, log=lambda _: None)


@pytest.mark.parametrize(
    ("device_type", "accumulation", "distributed", "expected"),
    [
        ("cuda", 1, False, "reduce-overhead"),
        ("cuda", 2, False, "default"),
        ("cuda", 1, True, "default"),
        ("cpu", 1, False, "default"),
        ("mps", 1, False, "default"),
    ],
)
def test_auto_compile_mode_uses_cuda_graphs_only_where_they_were_measured(
    small_config, device_type, accumulation, distributed, expected
):
    cfg = replace(small_config, compile_mode="auto",
                  gradient_accumulation_steps=accumulation)  # fmt: skip
    assert pick_compile_mode(cfg, accumulation, device_type, distributed) == expected


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_eval_chunk_evaluates_the_same_batches_in_fewer_passes(small_config):
    # 7 batches a split in passes of 3, 3 and 1: the same mean as one by one
    cfg = replace(small_config, eval_iters=7, dropout=0.0)
    t = setup(cfg, log=lambda _: None)
    seen = []
    one_by_one = evaluate(t, on_batch=lambda done: seen.append(done) or True)
    chunked_seen = []
    t.cfg = replace(cfg, eval_chunk=3)
    chunked = evaluate(t, on_batch=lambda done: chunked_seen.append(done) or True)
    assert seen == list(range(1, 15))
    assert chunked_seen == [3, 6, 7, 10, 13, 14]
    assert one_by_one is not None and chunked is not None
    for split in ("train", "val"):
        assert chunked[split] == pytest.approx(one_by_one[split], rel=1e-5)


def test_eval_train_iters_draws_fewer_train_batches_and_the_same_val_ones(
    small_config,
):
    # the train split's first 3 batches, then all 7 of val: val as before
    cfg = replace(small_config, eval_iters=7, dropout=0.0)
    t = setup(cfg, log=lambda _: None)
    full = evaluate(t)
    t.cfg = replace(cfg, eval_iters=3)
    three = evaluate(t)
    seen = []
    t.cfg = replace(cfg, eval_train_iters=3)
    fewer = evaluate(t, on_batch=lambda done: seen.append(done) or True)
    assert seen == list(range(1, 11))
    assert full is not None and three is not None and fewer is not None
    assert fewer["train"] == pytest.approx(three["train"], rel=1e-5)
    assert fewer["val"] == pytest.approx(full["val"], rel=1e-5)
    assert fewer["train"] != pytest.approx(full["train"], rel=1e-5)


def test_eval_graph_on_cuda_gives_the_plain_models_losses_and_is_refused_elsewhere(
    small_config, device
):
    if device.type != "cuda":
        # no graphs to capture: auto goes without, and true is refused by name
        with pytest.raises(DeviceError, match=r"--eval_graph=true needs a CUDA"):
            setup(replace(small_config, eval_graph="true"), log=lambda _: None)
        assert setup(small_config, log=lambda _: None).graphed_loss is None
        return
    cfg = replace(small_config, eval_iters=5, eval_chunk=2, dtype="auto",
                  compile="false", eval_graph="auto")  # fmt: skip
    t = setup(cfg, log=lambda _: None)
    graphed = t.graphed_loss
    assert graphed is not None
    graphs = []  # after each pass, how many graphs exist

    def count(done):
        graphs.append(len(graphed.graphs))
        return True

    for _ in range(2):  # after a step, the graphs must read the new weights
        graphs.clear()
        with_graphs = evaluate(t, count)
        # passes of 2, 2 and 1 batches: one graph per shape, both splits reuse
        # them, and the evaluation's end frees them
        assert graphs == [1, 1, 2, 2, 2, 2] and not graphed.graphs
        t.graphed_loss = None
        plain = evaluate(t)
        t.graphed_loss = graphed
        assert with_graphs is not None and plain is not None
        for split in ("train", "val"):
            # the same kernels, replayed: equal up to summation order
            assert with_graphs[split] == pytest.approx(plain[split], rel=1e-4)
        before = plain["val"]
        train_step(t)
    assert evaluate(t)["val"] != before


def test_target_val_loss_stops_at_the_first_evaluation_that_reaches_it(small_config):
    # Val loss starts near ln(65) = 4.17 and falls below 3.6 within 60 steps.
    cfg = replace(small_config, max_iters=200, eval_interval=3, eval_iters=4,
                  learning_rate=0.03, target_val_loss=3.6)  # fmt: skip
    result, out = run(cfg)
    *before, (at, _, val) = result.evals
    assert val <= 3.6 and all(v > 3.6 for _, _, v in before), result.evals
    assert result.iter_num == at < 200
    assert "reached target_val_loss=3.6" in result.stop_reason
    seconds = result.best[2]
    assert result.best[:2] == (at, val) and seconds > 0
    assert f"stopped at iteration {at} of 200: val loss {val:.4f} reached" in out
    assert f"best val loss {val:.4f} at iteration {at}, {seconds:.1f} s into" in out
    # loss.csv carries the run's clock: rising, and the target's row at its time
    rows = read_csv(Path(cfg.out_dir) / "loss.csv")
    elapsed = [float(row["elapsed_s"]) for row in rows]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    assert rows[-1]["iter"] == str(at) and elapsed[-1] == round(seconds, 3)


def test_patience_stops_after_that_many_evaluations_and_keeps_the_best(small_config):
    # A constant, high learning rate: val loss stops falling within 200 steps.
    cfg = replace(small_config, max_iters=200, eval_interval=3, eval_iters=4,
                  learning_rate=0.1, decay_lr=False, patience=2,
                  always_save_checkpoint=False)  # fmt: skip
    result, out = run(cfg)
    best_at, best_val, _ = result.best
    assert min(v for _, _, v in result.evals) == best_val
    after = [it for it, _, _ in result.evals if it > best_at]
    assert after == [best_at + 3, best_at + 6], result.evals
    assert result.iter_num == best_at + 6 < 200
    assert "(patience=2)" in result.stop_reason
    assert f"the checkpoint holds iteration {best_at}" in out
    saved = checkpoint.load(result.checkpoint)
    assert saved["iter_num"] == best_at and saved["best_val_loss"] == best_val


def test_the_run_clock_goes_on_from_the_checkpoint_when_resuming(small_config):
    cfg = replace(small_config, max_iters=6, eval_interval=3, lr_decay_iters=9)
    first, _ = run(cfg)
    before = checkpoint.load(first.checkpoint)["seconds"]
    resumed, _ = run(replace(cfg, max_iters=9, init_from="resume",
                             allow_changes="max_iters"))  # fmt: skip
    rows = read_csv(Path(cfg.out_dir) / "loss.csv")
    elapsed = {int(row["iter"]): float(row["elapsed_s"]) for row in rows}
    # Row 6 holds the first run's last evaluation; row 7 the resumed run's step.
    # loss.csv rounds to milliseconds: row 6 may read up to half of one more.
    assert elapsed[7] > before >= elapsed[6] - 0.0005 and elapsed[6] > 0
    in_order = [elapsed[it] for it in sorted(elapsed)]
    assert in_order == sorted(in_order) and resumed.iter_num == 9
