"""benchmarks/time_to_target.py --rescore: seeds run in several calls, scored as one."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_target.py"


def write_log(path: Path, evals: list[tuple[float, int, float]]) -> None:
    """A log as the script writes it: the command, then 'SECONDS  LINE'."""
    lines = ["python train.py ..."]
    for seconds, it, val in evals:
        lines.append(f"{seconds - 0.5:9.2f}  iter {it}: loss 2.0, 7.0 ms/iter")
        lines.append(f"{seconds:9.2f}  step {it}: train loss 1.9, val loss {val:.4f}")
    path.write_text("\n".join(lines) + "\n")


def rescore(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--rescore", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_logs_from_two_calls_are_scored_together(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    # nanoGPT's bests 1.35 and 1.33 (target 1.34) at 80 and 100 s
    write_log(first / "nanogpt-seed1.log", [(40, 1000, 1.5), (80, 2000, 1.35)])
    write_log(first / "nanogpt-seed2.log", [(50, 1000, 1.4), (100, 2000, 1.33),
                                            (120, 2250, 1.36)])  # fmt: skip
    # the template at 40-44 s, well under the target on 4 seeds in two calls
    for folder, seed, seconds, val in (
        (first, 1, 40, 1.300), (first, 2, 42, 1.310),
        (second, 3, 44, 1.305), (second, 4, 41, 1.295),
    ):  # fmt: skip
        write_log(folder / f"fast-seed{seed}-cold.log",
                  [(seconds - 10, 500, 1.6), (seconds, 1000, val)])  # fmt: skip
    done = rescore(first, second)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "target val loss 1.3400" in out
    assert "nanogpt (cold): best val 1.3400 (1.3300-1.3500)" in out
    assert "after 90.0 (80.0-100.0) s" in out
    assert "fast (cold): at iteration 1000 (1000-1000), after 41.8 (40.0-44.0) s" in out
    assert "0.46x nanoGPT's time to its best (goal 0.5x: met)" in out
    assert "by the record rule (t = " in out and "): yes" in out
    # one call's 2 seeds are too few for the record rule: the verdict fails
    done = rescore(first)
    assert done.returncode == 1
    assert "needs > 31.821): NO" in done.stdout


def test_a_run_found_twice_or_no_logs_is_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_log(tmp_path / name / "nanogpt-seed1.log", [(80, 2000, 1.35)])
    done = rescore(tmp_path / "a", tmp_path / "b")
    assert done.returncode != 0
    assert "nanogpt seed 1 cold twice" in done.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.log").write_text("not a run's log\n")
    done = rescore(tmp_path / "empty", "--target", "1.3")  # no silent pass
    assert done.returncode != 0
    assert "no run logs" in done.stderr
