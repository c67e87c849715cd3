#!/usr/bin/env python3
"""Time and steps to a target val loss: the generated project against nanoGPT.

    python benchmarks/time_to_target.py --nanogpt=DIR --project=PROJECT \\
        --seeds=1337,1338,1339,1340 --out=LOGS \\
        --template=adamw: --template=muon:--optimizer=muon

DIR is a nanoGPT checkout (train.py, model.py, configurator.py; never shipped
here), PROJECT an already baked project (omit it where cookiecutter is
installed). Settings come from one template Config of --preset, spelled out for
both programs as benchmarks/learning_parity.py does (its helpers are used).

1. nanoGPT's train.py runs once per seed, compiled where the device compiles
   (--compile), each with an empty TORCHINDUCTOR_CACHE_DIR of its own: a cold
   start. Its time to its best val loss is the moment the evaluation line with
   the lowest val loss was printed, counted from the process's start.
   --nanogpt_patience=K stops a run K evaluations after its best so far (an
   overfitting run's best is then almost surely already seen); 0 runs --iters.
2. The target is the mean of nanoGPT's best val losses (or --target).
3. Each --template=NAME:FLAGS runs once per seed with --target_val_loss=TARGET
   and FLAGS, first cold (a new out_dir: its compile cache, out_dir/compile-cache,
   is empty), then warm (the same out_dir with --overwrite=true, which keeps the
   cache). Its time to target is the moment its first evaluation line at or
   below the target was printed, from the process's start. FLAGS holding
   --recipe=NAME (--template=default:--recipe=fast) drop the settings that
   recipe sets from the spelled-out ones, so the run is the recipe's own.

Two clocks are printed, for both programs alike. **From the process's
start**: the wall clock between the process's start and a line of its output
(unbuffered output, read as it comes), so start-up, compilation and
evaluations count; the verdict uses it. **Training alone**, as modded-nanogpt
and karpathy/autoresearch count a record (start-up, compilation and
evaluations left out): the iterations to the target (nanoGPT: to its best)
times the median time of the steps the program logged after its first (its
own "iter N: ..., time" figures; the first holds the compilation, and a step
with an evaluation before it is an outlier the median leaves out).

The verdict, per template program and start: every run reached the target;
the mean val loss at the stop of the cold starts is below the target by
modded-nanogpt's record rule (a one-sided t-test over the seeds, p < 0.01);
the mean time to target from the process's start is at most --goal
(0.33) times nanoGPT's mean time to its best (cold starts both), and a warm
start's at most --goal_warm (0.25) times it; and every cold start's first
training step (its first logged step line: compiling or recording it is in
it) is done at most --goal_startup (15) seconds after the process's start.

Seeds run in several calls (a lent GPU's 10-minute limit) are scored together
from their logs, the same verdict over all of them:

    python benchmarks/time_to_target.py --rescore LOGS1 LOGS2 ...

On a CPU (the tiny preset, no compilation), a check of the script and its CPU
figure:

    python benchmarks/time_to_target.py --nanogpt=DIR --preset=tiny --device=cpu \\
        --compile=false --seeds=1,2 --iters=300 --eval_interval=50 --eval_iters=10 \\
        --lr_decay_iters=300 --template=adamw: --template=muon:--optimizer=muon

Figures (H200, and this CPU check) are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_parity import (  # noqa: E402  (sibling scripts, not a package)
    EVAL_LINE,
    ITER_LINE,
    check_nanogpt,
    nanogpt_command,
    nanogpt_workdir,
    prepare_run,
    template_command,
    write_json,
)

# One-sided Student t critical values at p = 0.01, by degrees of freedom.
T_01 = {1: 31.821, 2: 6.965, 3: 4.541, 4: 3.747, 5: 3.365, 6: 3.143, 7: 2.998,
        8: 2.896, 9: 2.821, 10: 2.764, 15: 2.602, 20: 2.528, 30: 2.457}  # fmt: skip


# The template's step time from a second on ("17.3 s/iter", progress.per_iter).
TEMPLATE_SECONDS_LINE = re.compile(r"^iter (\d+): loss \S+, ([\d.]+) s/iter")


def step_ms(program: str, line: str) -> tuple[int, float] | None:
    """(iteration, milliseconds) of a training step the program logged, or None."""
    kind = "nanogpt" if program == "nanogpt" else "template"
    if m := ITER_LINE[kind].match(line):
        return int(m[1]), float(m[2])
    if kind == "template" and (m := TEMPLATE_SECONDS_LINE.match(line)):
        return int(m[1]), float(m[2]) * 1000
    return None


def training_seconds(record: dict[str, Any], iteration: int) -> float | None:
    """Training alone to `iteration`: iterations times the median logged step
    time after the first step (which holds the compilation); None unlogged."""
    steps = [ms for it, ms in record.get("steps", []) if it >= 1]
    if not steps:
        return None
    return iteration * statistics.median(steps) / 1000


def t_critical(df: int) -> float:
    """The table's value for `df`, or for the nearest smaller df it lists."""
    return T_01[max(k for k in T_01 if k <= df)]


def run_timed(
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    stop: Any = None,
    deadline_s: float = 0.0,
    program: str = "template",
) -> dict[str, Any]:
    """Run `command`, stamping each output line with the seconds since its start.

    `stop(evals)` is asked after each evaluation line ([(iteration, val loss,
    seconds)]); True ends the run there (killed: nothing after it is measured).
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1,
    )  # fmt: skip
    evals: list[tuple[int, float, float]] = []
    steps: list[tuple[int, float]] = []
    first_step_s: float | None = None
    status = ""
    assert proc.stdout is not None
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        for line in proc.stdout:
            now = time.perf_counter() - start
            log.write(f"{now:9.2f}  {line}")
            if step := step_ms(program, line):
                steps.append(step)
                if first_step_s is None:
                    first_step_s = round(now, 2)
            if m := EVAL_LINE.match(line):
                evals.append((int(m[1]), float(m[3]), round(now, 2)))
                if stop is not None and stop(evals):
                    status = f"stopped by this script at iteration {m[1]}"
                    break
            if deadline_s and now > deadline_s:
                status = f"killed at --deadline_s={deadline_s:g}"
                break
    if status:
        proc.kill()
    rc = proc.wait()
    tail = log_path.read_text(errors="replace")[-1500:] if rc and not status else ""
    return {
        "status": status or ("ok" if rc == 0 else f"exit {rc}"),
        "wall_s": round(time.perf_counter() - start, 2),
        "evals": evals,
        "steps": steps,
        "first_step_s": first_step_s,
        "log": str(log_path),
        "tail": tail,
    }


def best(evals: list[tuple[int, float, float]]) -> tuple[int, float, float] | None:
    finite = [e for e in evals if not math.isnan(e[1])]
    return min(finite, key=lambda e: e[1]) if finite else None


def reached(evals, target: float) -> tuple[int, float, float] | None:
    return next((e for e in evals if e[1] <= target), None)


def clean_env(project: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Each run's compile caches are its own: none shared through the environment.
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(project / "src"), env.get("PYTHONPATH", "")) if p
    )
    return env


def run_nanogpt(pkg, cfg, args, root: Path, out: Path) -> list[dict[str, Any]]:
    runs = []
    for seed in args.seed_list:
        work = nanogpt_workdir(args, cfg, seed, root)
        env = clean_env(args.project)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")  # empty: cold

        def stop(evals: list[tuple[int, float, float]]) -> bool:
            top = best(evals)
            patience = args.nanogpt_patience
            return bool(patience and top and evals[-1][0] > top[0]
                        and sum(e[0] > top[0] for e in evals) >= patience)  # fmt: skip

        record = run_timed(
            nanogpt_command(pkg, cfg, args, work), work, env,
            out / f"nanogpt-seed{seed}.log", stop, args.deadline_s, "nanogpt",
        )  # fmt: skip
        record.update(
            program="nanogpt", seed=seed, start="cold", best=best(record["evals"])
        )
        runs.append(record)
        print(summary_line(record), flush=True)
        write_json(out / "results.json", {"args": describe(args), "runs": runs})
    return runs


def recipe_command(pkg, cfg, command: list[str], flags: list[str]) -> list[str]:
    """`command` less what a `--recipe=NAME` among `flags` sets for the preset.

    template_command spells out nanoGPT's recipe (its --max_iters, ...), and a
    setting typed on the command line wins over a recipe: a program that names
    a recipe gets that recipe's own values, as a user typing `train
    --recipe=NAME` does. An unknown recipe is left for the template to refuse.
    """
    named = [f.split("=", 1)[1] for f in flags if f.startswith("--recipe=")]
    if not named:
        return command
    owned = {"recipe", *pkg.config.RECIPES.get(named[-1], {}).get(cfg.preset, {})}
    return [part for part in command if part.split("=", 1)[0][2:] not in owned]


def run_template(pkg, cfg, args, root, out, target, runs) -> list[dict[str, Any]]:
    for seed in args.seed_list:
        for name, flags in args.template_list:
            work = root / f"{name}-seed{seed}"
            work.mkdir(parents=True)
            command = template_command(pkg, cfg, args, seed, work / "out")
            command = recipe_command(pkg, cfg, command, flags)
            command += [f"--target_val_loss={target:.6f}", *flags]
            for start in ("cold", "warm"):
                again = ["--overwrite=true"] if start == "warm" else []
                record = run_timed(
                    command + again, work, clean_env(args.project),
                    out / f"{name}-seed{seed}-{start}.log", None, args.deadline_s,
                    name,
                )  # fmt: skip
                record.update(program=name, seed=seed, start=start,
                              reached=reached(record["evals"], target))  # fmt: skip
                runs.append(record)
                print(summary_line(record), flush=True)
                write_json(out / "results.json", {"args": describe(args), "runs": runs})
    return runs


LOG_NAME = re.compile(
    r"^(?P<program>.+)-seed(?P<seed>\d+)(?:-(?P<start>cold|warm))?\.log$"
)


def runs_from_logs(folders: list[Path], target: float | None) -> tuple[list, float]:
    """The runs that the logs in `folders` record, and the target they are scored
    against: `target`, or the mean of nanoGPT's best val losses in those logs.

    Each log line is "SECONDS  LINE" as run_timed writes it, so several
    invocations' runs (seeds spread over calls) are scored as one set.
    """
    runs: list[dict[str, Any]] = []
    seen: set[tuple[str, int, str]] = set()
    for folder in folders:
        matched = [
            (log, m) for log in sorted(folder.glob("*.log"))
            if (m := LOG_NAME.match(log.name))
        ]  # fmt: skip
        if not matched:
            raise SystemExit(
                f"--rescore {folder}: no run logs (NAME-seedN[-START].log)"
            )
        for log, m in matched:
            program, seed = m["program"], int(m["seed"])
            start = m["start"] or "cold"
            key = (program, seed, start)
            if key in seen:
                raise SystemExit(
                    f"--rescore: {program} seed {seed} {start} twice ({log})"
                )
            seen.add(key)
            evals = []
            steps = []
            first_step_s = None
            for line in log.read_text(errors="replace").splitlines()[1:]:
                stamp, _, text = line.strip().partition("  ")
                if e := EVAL_LINE.match(text.strip()):
                    evals.append((int(e[1]), float(e[3]), float(stamp)))
                elif step := step_ms(program, text.strip()):
                    steps.append(step)
                    if first_step_s is None:
                        first_step_s = float(stamp)
            record: dict[str, Any] = {"program": program, "seed": seed,
                                      "start": start, "evals": evals, "steps": steps,
                                      "first_step_s": first_step_s,
                                      "status": "from its log", "tail": ""}  # fmt: skip
            if program == "nanogpt":
                record["best"] = best(evals)
            runs.append(record)
    if target is None:
        bests = [r["best"][1] for r in runs if r.get("best")]
        if not bests:
            raise SystemExit("--rescore: no nanoGPT log with a val loss; pass --target")
        target = statistics.fmean(bests)
    for r in runs:
        if r["program"] != "nanogpt":
            r["reached"] = reached(r["evals"], target)
    return runs, target


def summary_line(r: dict[str, Any]) -> str:
    what = ""
    if r.get("best"):
        it, val, s = r["best"]
        what = f"best val {val:.4f} at iteration {it}, {s:.1f} s"
    elif "reached" in r:
        hit = r["reached"]
        what = (
            f"target at iteration {hit[0]} (val {hit[1]:.4f}), {hit[2]:.1f} s"
            if hit
            else "target NOT reached"
        )
    return f"{r['program']} seed {r['seed']} {r['start']}: {r['status']}, {what}" + (
        f"\n{r['tail']}" if r["tail"] else ""
    )


def verdict(
    runs: list[dict[str, Any]],
    target: float,
    goal: float,
    base: float | None,
    goal_warm: float = 0.25,
    goal_startup: float = 15.0,
) -> bool:
    """Print each program's figures and whether they meet the goals (`goal` for
    cold starts, `goal_warm` for warm ones, and each cold start's first step
    done within `goal_startup` seconds); `base`: nanoGPT's mean time to its
    best, when its runs are not among `runs`."""
    nano_runs = [r for r in runs if r["program"] == "nanogpt" and r["best"]]
    nano = [r["best"] for r in nano_runs]
    print(f"\ntarget val loss {target:.4f}")
    train_base = _training_alone(nano_runs, "best")
    if nano:
        base = statistics.fmean(b[2] for b in nano)
        print(
            f"nanogpt (cold): best val {spread([b[1] for b in nano], 4)}, at"
            f" iteration {spread([b[0] for b in nano], 0)}, after"
            f" {spread([b[2] for b in nano], 1)} s from the process's start;"
            f" training alone {_seconds(train_base)}; {_first_step(nano_runs)}"
        )
    met = True
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r["program"] != "nanogpt":
            groups.setdefault((r["program"], r["start"]), []).append(r)
    for (name, start), group in groups.items():
        hits = [r["reached"] for r in group if r["reached"]]
        if len(hits) < len(group) or len(hits) < 2:
            print(
                f"{name} ({start}): {len(hits)} of {len(group)} runs reached the target"
            )
            met = False
            continue
        vals = [h[1] for h in hits]
        sd = statistics.stdev(vals)
        t = (
            (target - statistics.fmean(vals)) / (sd / math.sqrt(len(vals)))
            if sd
            else math.inf
        )
        margin = t > t_critical(len(vals) - 1)
        seconds = statistics.fmean(h[2] for h in hits)
        ratio = seconds / base if base else math.nan
        wanted = goal if start == "cold" else goal_warm
        fast = ratio <= wanted  # False without a nanoGPT time to compare with
        alone = _training_alone(group, "reached")
        firsts = [r["first_step_s"] for r in group if r.get("first_step_s") is not None]
        started = len(firsts) == len(group) and max(firsts) <= goal_startup
        startup = _first_step(group) + (
            f" (goal {goal_startup:g} s: {'met' if started else 'NOT met'})"
            if start == "cold"
            else ""
        )
        alone_ratio = (
            f" ({statistics.fmean(alone) / statistics.fmean(train_base):.2f}x"
            " nanoGPT's)"
            if alone and train_base
            else ""
        )
        print(
            f"{name} ({start}): at iteration {spread([h[0] for h in hits], 0)}, after"
            f" {spread([h[2] for h in hits], 1)} s from the process's start;"
            f" {ratio:.2f}x nanoGPT's time to its best (goal {wanted}x:"
            f" {'met' if fast else 'NOT met'}); training alone"
            f" {_seconds(alone)}{alone_ratio}; {startup}; val at the stop"
            f" {spread(vals, 4)},"
            " below the target by the record rule"
            f" (t = {t:.2f}, needs > {t_critical(len(vals) - 1)}):"
            f" {'yes' if margin else 'NO'}"
        )
        # the record rule and start-up are judged on cold starts; each start
        # has its goal for the time to target
        met = met and fast and (start != "cold" or (margin and started))
    return met


def verdict_of(
    args: argparse.Namespace, runs: list[dict[str, Any]], target: float
) -> bool:
    """verdict() with the goals and nanoGPT's time as the command line gives them."""
    return verdict(runs, target, args.goal, args.nanogpt_seconds, args.goal_warm,
                   args.goal_startup)  # fmt: skip


def _first_step(group: list[dict[str, Any]]) -> str:
    """The runs' first training step done, from the process's start."""
    firsts = [r["first_step_s"] for r in group if r.get("first_step_s") is not None]
    if not firsts or len(firsts) < len(group):
        return "first training step done: n/a (a run logged no step)"
    return f"first training step done after {spread(firsts, 1)} s"


def _training_alone(group: list[dict[str, Any]], key: str) -> list[float]:
    """Each run's training alone to its `key` point (best or reached), where logged."""
    found = [training_seconds(r, r[key][0]) for r in group if r.get(key) is not None]
    return [s for s in found if s is not None]


def _seconds(values: list[float]) -> str:
    return f"{spread(values, 1)} s" if values else "n/a (no step times logged)"


def spread(values: list[float], digits: int) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def describe(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nanogpt", type=Path, help="a nanoGPT checkout (not for --rescore)"
    )
    parser.add_argument("--project", type=Path, help="an already baked project")
    parser.add_argument("--preset", default="shakespeare_char")
    parser.add_argument("--seeds", default="1337,1338,1339,1340")
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--eval_interval", type=int, default=250)
    parser.add_argument("--eval_iters", type=int, default=200)
    parser.add_argument("--lr_decay_iters", type=int, default=5000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", default="auto", choices=("auto", "true", "false"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a template setting for both programs")  # fmt: skip
    parser.add_argument("--template", action="append", default=[], metavar="NAME:FLAGS",
                        help="a template program: a name and its own flags,"
                        " comma-separated (default: template:)")  # fmt: skip
    parser.add_argument("--target", type=float, help="default: nanoGPT's mean best")
    parser.add_argument("--nanogpt_patience", type=int, default=0)
    parser.add_argument("--nanogpt_seconds", type=float,
                        help="with --skip_nanogpt: its time to its best")  # fmt: skip
    parser.add_argument("--goal", type=float, default=0.33,
                        help="cold starts: at most this times nanoGPT's time"
                        " to its best (issue 58: 0.33)")  # fmt: skip
    parser.add_argument("--goal_warm", type=float, default=0.25,
                        help="warm starts: the same, for the second run of"
                        " each out_dir (issue 58: 0.25)")  # fmt: skip
    parser.add_argument("--goal_startup", type=float, default=15.0,
                        help="cold starts: every run's first training step done"
                        " within this many seconds (issue 58: 15)")  # fmt: skip
    parser.add_argument("--deadline_s", type=float, default=0.0, help="per run")
    parser.add_argument("--skip_nanogpt", action="store_true",
                        help="template runs only (needs --target)")  # fmt: skip
    parser.add_argument("--nanogpt_only", action="store_true",
                        help="nanoGPT runs and their target only")  # fmt: skip
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rescore", type=Path, nargs="+", metavar="DIR",
                        help="score the run logs in these --out folders together"
                        " (seeds run in several calls); runs nothing")  # fmt: skip
    args = parser.parse_args(argv)
    if args.rescore:
        runs, target = runs_from_logs(args.rescore, args.target)
        for r in runs:
            print(summary_line(r))
        return 0 if verdict_of(args, runs, target) else 1
    if args.nanogpt is None:
        parser.error("--nanogpt is required (except with --rescore)")
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    args.template_list = []
    for item in args.template or ["template:"]:
        name, sep, flags = item.partition(":")
        if not sep or not name:
            parser.error(f"--template={item}: expected NAME:FLAGS (FLAGS may be empty)")
        args.template_list.append((name, [f for f in flags.split(",") if f]))
    if args.skip_nanogpt and args.target is None:
        parser.error("--skip_nanogpt needs --target")
    check_nanogpt(parser, args)
    with tempfile.TemporaryDirectory(prefix="time-to-target-") as tmp:
        root = Path(tmp)
        pkg, cfg, out = prepare_run(args, root, f"up to {args.iters} iterations")
        runs = [] if args.skip_nanogpt else run_nanogpt(pkg, cfg, args, root, out)
        target = args.target
        if target is None:
            bests = [r["best"][1] for r in runs if r["best"]]
            if not bests:
                print("no nanoGPT run printed a val loss: no target")
                return 1
            target = statistics.fmean(bests)
        if args.nanogpt_only:
            args.template_list = []
        runs = run_template(pkg, cfg, args, root / "runs", out, target, runs)
        met = verdict_of(args, runs, target)
        result = {"args": describe(args), "target": target, "runs": runs}
        write_json(out / "results.json", result)
        shutil.rmtree(root / "runs", ignore_errors=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
