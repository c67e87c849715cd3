"""What a run reports: its best evaluation, why it stops early, loss.csv and
the loss curve. Plain functions of the run's numbers, written atomically."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .config import Config
from .files import write_atomic


def best_eval(
    evals: list[tuple[int, float, float]], seconds: dict[int, float]
) -> tuple[int, float, float | None] | None:
    """(iteration, val loss, seconds into the run) of the first lowest val loss."""
    if not evals:
        return None
    it, _, val = min(evals, key=lambda e: e[2])  # min keeps the first of equals
    return it, val, seconds.get(it)


def early_stop(cfg: Config, evals: list[tuple[int, float, float]]) -> str:
    """Why the run stops after its latest evaluation ('' to go on): val loss at
    target_val_loss, or `patience` evaluations since the lowest one."""
    if not evals:
        return ""
    it, _, val = evals[-1]
    if cfg.target_val_loss > 0 and val <= cfg.target_val_loss:
        return f"val loss {val:.4f} reached target_val_loss={cfg.target_val_loss:g}"
    best = best_eval(evals, {})
    assert best is not None
    since = sum(1 for e in evals if e[0] > best[0])
    if cfg.patience > 0 and since >= cfg.patience:
        return (
            f"val loss has not fallen below {best[1]:.4f} (iteration {best[0]}) in"
            f" {since} evaluations (patience={cfg.patience})"
        )
    return ""


def write_loss_csv(
    path: Path,
    losses: list[tuple[int, float]],
    evals: list[tuple[int, float, float]],
    log_seconds: dict[int, float],
    eval_seconds: dict[int, float],
) -> None:
    """loss.csv (see loss_rows), replaced whole or not at all."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(
        ["iter", "train_loss", "eval_train_loss", "eval_val_loss", "elapsed_s"]
    )
    writer.writerows(loss_rows(losses, evals, log_seconds, eval_seconds))
    write_atomic(path, text.getvalue().encode())


def loss_rows(
    losses: list[tuple[int, float]],
    evals: list[tuple[int, float, float]],
    log_seconds: dict[int, float] | None = None,
    eval_seconds: dict[int, float] | None = None,
) -> list[list[int | float | str]]:
    """loss.csv's rows in iteration order: one per iteration, with its logged
    training loss and its evaluation where it has them (blank where not), and
    the seconds into the run when the row's evaluation ended (or, without one,
    when its loss was read): blank where a run from before the clock left none."""
    log_seconds, eval_seconds = log_seconds or {}, eval_seconds or {}
    rows: dict[int, list[int | float | str]] = {}
    for it, loss in losses:
        rows.setdefault(it, [it, "", "", "", ""])[1] = loss
    for it, train_loss, val_loss in evals:
        rows.setdefault(it, [it, "", "", "", ""])[2:4] = [train_loss, val_loss]
    for it, row in rows.items():
        seconds = eval_seconds.get(it, log_seconds.get(it))
        row[4] = "" if seconds is None else round(seconds, 3)
    return [rows[it] for it in sorted(rows)]


def plot_losses(
    losses: list[tuple[int, float]],
    evals: list[tuple[int, float, float]],
    png: Path,
    csv_path: Path,
) -> str:
    """Draw the loss curve if matplotlib is installed; say what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return (
            "no loss curve: matplotlib is not installed (the project's plot extra:"
            f" pip install -e '.[plot]'); the numbers are in {csv_path}"
        )
    fig, ax = plt.subplots(figsize=(7, 4))
    if losses:
        its, train_batch = zip(*losses, strict=True)
        ax.plot(its, train_batch, label="train (batch)", alpha=0.6)
    if evals:
        its, train_losses, val_losses = zip(*evals, strict=True)
        ax.plot(its, train_losses, "o-", label="train (eval)")
        ax.plot(its, val_losses, "o-", label="val (eval)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return f"loss curve: {png}"
