#!/usr/bin/env python3
"""Cold start of the generated project's `train`: where the first seconds go.

    python benchmarks/cold_start.py --project=PROJECT --target=1.3494 \\
        --config=compiled: --config=eager:--compile=false --seeds=1337,1338 --warm

Each --config=NAME:FLAGS runs the project's default `train` (its preset's
default recipe) once per seed with --target_val_loss=TARGET and FLAGS, as a
whole process with an empty out_dir (its compile cache, out_dir/compile-cache,
empty: a cold start); configurations alternate within each seed, so drift hits
them alike. From the process's start, read off its unbuffered output as it
comes, it prints the seconds to:

- the first line (imports done);
- the first training step done (its `iter 0:` line; its compilation is in it);
- the first evaluation at or below the target, with its iteration.

With --warm each run is followed by a second in the same out_dir
(--overwrite=true), whose compile cache the first filled: a warm start.

PROJECT is an already baked project (`cookiecutter template/`); its corpus is
prepared first (`prepare`, with --prepare's flags). Figures (H200) are in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_parity import EVAL_LINE, ITER_LINE  # noqa: E402  (sibling scripts)
from time_to_target import TEMPLATE_SECONDS_LINE, clean_env, run_timed  # noqa: E402


def package_name(project: Path) -> str:
    """The one package under PROJECT/src."""
    found = [
        p.name for p in (project / "src").iterdir() if (p / "__main__.py").is_file()
    ]
    if len(found) != 1:
        raise SystemExit(f"{project}/src: expected one package, found {found}")
    return found[0]


def read_log(path: Path, target: float) -> dict[str, float | int | None]:
    """Seconds to the first line, the first logged step, the target (from a log
    whose lines run_timed stamped with the seconds since the process's start)."""
    first_line = first_step = reached = None
    reached_at = None
    for raw in path.read_text(errors="replace").splitlines()[1:]:
        stamp, _, line = raw.strip().partition("  ")
        try:
            seconds = float(stamp)
        except ValueError:
            continue
        line = line.strip()
        if first_line is None and line:
            first_line = seconds
        if first_step is None and (
            ITER_LINE["template"].match(line) or TEMPLATE_SECONDS_LINE.match(line)
        ):
            first_step = seconds
        m = EVAL_LINE.match(line)
        if reached is None and m and float(m[3]) <= target:
            reached, reached_at = seconds, int(m[1])
    return {
        "first_line_s": first_line,
        "first_step_s": first_step,
        "target_s": reached,
        "target_iter": reached_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--config", action="append", default=[], metavar="NAME:FLAGS")
    parser.add_argument("--seeds", default="1337")
    parser.add_argument(
        "--prepare", default="", metavar="FLAGS", help="flags of the one `prepare` run"
    )
    parser.add_argument("--warm", action="store_true", help="each run again, warm")
    parser.add_argument("--deadline_s", type=float, default=0.0, help="per run")
    parser.add_argument("--out", type=Path, help="the logs (default: a temp folder)")
    args = parser.parse_args()
    configs = [c.partition(":")[::2] for c in args.config or ["default:"]]
    if args.warm:
        configs = [
            (f"{name}{start}", flags)
            for name, flags in configs
            for start in ("", "-warm")
        ]
    project = args.project.resolve()
    package = package_name(project)
    out = (args.out or Path(tempfile.mkdtemp(prefix="cold-start-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, float | int | None]]] = {n: [] for n, _ in configs}
    subprocess.run(
        [sys.executable, "-m", package, "prepare", *args.prepare.split()],
        cwd=project, env=clean_env(project), check=True,
    )  # fmt: skip
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name, flags in configs:
            warm = name.endswith("-warm")
            run_dir = out / f"{name.removesuffix('-warm')}-{seed}"
            command = [
                sys.executable, "-m", package, "train", f"--out_dir={run_dir}",
                f"--seed={seed}", f"--target_val_loss={args.target}", *flags.split(),
                *(["--overwrite=true"] if warm else []),
            ]  # fmt: skip
            started = time.strftime("%H:%M:%S")
            result = run_timed(
                command, project, clean_env(project), out / f"{name}-{seed}.log",
                deadline_s=args.deadline_s,
            )  # fmt: skip
            found = read_log(Path(result["log"]), args.target)
            rows[name].append(found)
            print(
                f"{started} {name} seed {seed}: {result['status']}, first line "
                f"{found['first_line_s']} s, first logged step {found['first_step_s']}"
                f" s, target {found['target_s']} s (iter {found['target_iter']})",
                flush=True,
            )
            if result["tail"]:
                print(result["tail"])
    print(f"\ncold start, median over seeds {args.seeds}, seconds from the start")
    head = ("config", "first line", "first step", "target", "reached")
    print(f"{head[0]:<12} {head[1]:>10} {head[2]:>10} {head[3]:>8} {head[4]:>8}")
    for name, found in rows.items():

        def med(key: str, found: list[dict[str, float | int | None]] = found) -> str:
            values = [float(f[key]) for f in found if f[key] is not None]
            return f"{statistics.median(values):.1f}" if values else "-"

        hits = sum(f["target_s"] is not None for f in found)
        print(
            f"{name:<12} {med('first_line_s'):>10} {med('first_step_s'):>10} "
            f"{med('target_s'):>8} {hits:>4}/{len(found)}"
        )


if __name__ == "__main__":
    main()
