#!/usr/bin/env python3
"""What the generated project learns per step, beside nanoGPT's train.py, over seeds.

    python benchmarks/learning_parity.py --nanogpt=DIR --project=PROJECT \\
        --seeds=1337,1338,1339,1340,1341 --iters=5000 --out=LOGS

DIR is a nanoGPT checkout (model.py, train.py, configurator.py; never shipped
here), PROJECT an already baked project (omit it where cookiecutter is installed:
the template is baked into a temporary folder). Two parts:

Step check (CPU, float32, a few seconds, before anything else): the generated
project's `create` and `train_step` and DIR/model.py's `GPT` and
`configure_optimizers`, driven the way DIR/train.py drives them (forward, loss
divided by gradient_accumulation_steps, backward, unscale, clip, step, zero_grad)
with DIR/train.py's own `get_lr` (read out of the file), from the same seed on the
same batches, with the preset's dropout (each program's dropout stream saved and
restored around its step, so both draw the same masks). It prints whether the
initial weights are identical, the largest learning-rate difference over both
schedules, and the per-step training losses side by side. Equal losses mean
that, given the same random numbers, both programs take the same step.

Seeds: each program in --programs runs once per seed as a subprocess, on the same
prepared corpus (written in nanoGPT's format for train.py), with the preset's
settings spelled out for all from one Config, evaluation every --eval_interval
iterations over --eval_iters batches per split, and --lr_decay_iters for all.
nanoGPT's train.py seeds torch with the constant 1337: the copy run here gets
the seed put in its place (measuring only). Programs: `template` (its `train`
command as shipped: training offsets from seeded CPU generators), `nanogpt`
(DIR/train.py), and two template variants that change only where the training
offsets come from (see run_variant): `template_device_offsets` (a generator on
the device, as the template drew them before issue 15) and `template_own_key`
(the same, keyed apart from the dropout generator's seed); the variants also
re-estimate the final val loss on windows drawn from other CPU seeds.
The table gives each run's val loss at --points (all print "step N: train loss
X, val loss Y"), the median of its printed per-iteration times after --warmup
iterations, per program the mean, sample standard deviation and range, then each
template program minus nanoGPT: the difference of means with its standard error,
and the mean difference paired by seed (one seed gives both programs the same
initial weights), against --goal.

Run one process at a time (the default). `--parallel=N` runs N at once on the
one GPU; on the lent H100 six at once crawled at 266 ms/iter each (against 6 to
15 ms alone): the GPU's time slicing between processes costs far more than it
saves. A 5000-iteration run alone takes about 1.5 (template) to 2 (train.py)
minutes with compilation, so give each device command a few seeds (--seeds) and
combine the results.json files with --merge. Logs (one per run), results.json
and the table go to --out.

Measured on the lent H100 (torch 2.11, bf16, eager; issue 15). Before: with
offsets drawn on the device, template val@1000 was +0.0119 ± 0.0020 above
train.py paired by seed (1337-1340, --iters=1000), and +0.0040 ± 0.0033 with the
offsets drawn on the CPU (the variant then called template_cpu_offsets). The
template now draws them on the CPU; the same preset, eval every 500 over 200
batches, lr_decay_iters 5000, in five device commands (the project baked with
cookiecutter beforehand, since the device has none):

    P="python3 benchmarks/learning_parity.py --nanogpt=nanogpt \\
       --project=parity-gpt --programs=template,nanogpt --dtype=bfloat16 \\
       --compile=false"
    $P --iters=5000 --points=1000,5000 --seeds=1337,1338,1339 --deadline_s=505 \\
       --out=$OUT/a      # seed 1339's pair was killed by the deadline: rerun in c
    $P --step_check=off --iters=5000 --points=1000,5000 --seeds=1339 \\
       --deadline_s=300 --out=$OUT/c
    $P --step_check=off --iters=5000 --points=1000,5000 --seeds=1340 \\
       --deadline_s=330 --out=$OUT/d      # and --seeds=1341 --out=$OUT/e
    $P --step_check=off --iters=1000 --points=500,1000 \\
       --seeds=1342,1343,1344,1345,1346,1347,1348,1349 --deadline_s=520 --out=$OUT/f
    python3 benchmarks/learning_parity.py \\
       --merge=a/results.json,c/results.json,d/results.json,e/results.json

(a without its two killed runs; c's results.json did not come back from the
device, its two runs were taken from its printed table.)

    | seed | program  | val@1000 | val@5000 | ms/iter |
    |------|----------|----------|----------|---------|
    | 1337 | template | 1.4155   | 1.5265   | 12.50   |
    | 1337 | nanogpt  | 1.4183   | 1.5218   | 15.59   |
    | 1338 | template | 1.4218   | 1.5300   | 12.60   |
    | 1338 | nanogpt  | 1.4147   | 1.5308   | 16.37   |
    | 1339 | template | 1.4296   | 1.5317   | 13.10   |
    | 1339 | nanogpt  | 1.4131   | 1.5333   | 17.39   |
    | 1340 | template | 1.4333   | 1.5169   | 13.70   |
    | 1340 | nanogpt  | 1.4284   | 1.5215   | 15.95   |
    | 1341 | template | 1.4315   | 1.5255   | 15.70   |
    | 1341 | nanogpt  | 1.4304   | 1.5261   | 17.36   |

    template val@1000 1.4263 ± 0.0075, val@5000 1.5261 ± 0.0057 (n=5)
    nanogpt  val@1000 1.4210 ± 0.0079, val@5000 1.5267 ± 0.0053 (n=5)
    template - nanogpt: val@5000 -0.0006 (± 0.0035), paired -0.0006 ± 0.0015;
    val@1000 +0.0054 (± 0.0049), paired +0.0054 ± 0.0033 over these 5 seeds

The val@1000 gap over five seeds is smaller than its noise: the same seed and
program run twice gave template val@1000 1.4178 (a, before the kill) and 1.4296
(c), and 1340/1341 in 1000-iteration runs (the same first 1000 steps) gave
template 1.4260/1.4254 and nanogpt 1.4320/1.4218 against the 5000-iteration
runs' 1.4333/1.4315 and 1.4284/1.4304: eager CUDA runs differ by about 0.01
at 1000 from their nondeterministic kernels alone, as much as seeds do. So f
ran seven more seeds at 1000 (1349's nanogpt run was killed by the deadline):

    | seed     | 1342   | 1343   | 1344   | 1345   | 1346   | 1347   | 1348   |
    | template | 1.4062 | 1.4330 | 1.4087 | 1.4352 | 1.4349 | 1.4225 | 1.4180 |
    | nanogpt  | 1.4255 | 1.4208 | 1.4494 | 1.4314 | 1.4305 | 1.4206 | 1.4354 |

    paired -0.0079 ± 0.0070 over these 7 (val@500: +0.0062 ± 0.0018)

Over all twelve seeds at 1000: template 1.4242 ± 0.0103, nanogpt 1.4265 ±
0.0101, paired -0.0024 ± 0.0046 (sample sd 0.0160). Both points are within the
0.005 goal. ms/iter: median after iteration 100; template 11.9-16.5, nanogpt
14.2-20.7 over all runs; the processes ran one at a time.

A check of the script itself on a CPU (tiny model, a few iterations):

    python benchmarks/learning_parity.py --nanogpt=DIR --device=cpu --compile=false \\
        --programs=template,template_device_offsets,template_own_key,nanogpt \\
        --seeds=1,2 --iters=40 --eval_interval=20 --eval_iters=4 --points=20,40 \\
        --warmup=5 --set=n_layer=2 --set=n_head=2 --set=n_embd=64 \\
        --set=block_size=32 --set=batch_size=8 --set=warmup_iters=5
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
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
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_speed import (  # noqa: E402  (a sibling script, not a package)
    bake,
    load_nanogpt_model,
    load_package,
    write_nanogpt_data,
)

# The template as shipped (its `train` command), two variants that draw its
# training offsets on the device instead (see run_variant), and nanoGPT's train.py.
VARIANTS = {
    "template_device_offsets": "device_offsets",
    "template_own_key": "own_key",
}
PROGRAMS = ("template", *VARIANTS, "nanogpt")
SELF = str(Path(__file__).resolve())
# The settings both programs take under the same name, from one template Config.
SHARED = (
    "batch_size",
    "block_size",
    "gradient_accumulation_steps",
    "n_layer",
    "n_head",
    "n_embd",
    "dropout",
    "bias",
    "learning_rate",
    "min_lr",
    "warmup_iters",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "log_interval",
)
# train.py's one seed, a constant; the measured copy gets the run's seed instead.
NANOGPT_SEED_LINE = "torch.manual_seed(1337 + seed_offset)"
EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+|nan), val loss ([\d.]+|nan)")
ITER_LINE = {
    "template": re.compile(r"^iter (\d+): loss \S+, ([\d.]+) ms/iter"),
    "nanogpt": re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms"),
}
CPU_WINDOWS_LINE = re.compile(r"^val on CPU-drawn windows \[seed \d+\]: ([\d.]+)")


# ------------------------------------------------------------------ settings
def parity_config(pkg: SimpleNamespace, args: argparse.Namespace, data_dir: Path):
    """The one Config both programs' settings come from: nanoGPT's recipe."""
    cfg = pkg.config.Config.for_preset(args.preset, "nanogpt")
    changes: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in pkg.config.FIELDS:
            sys.exit(f"--set={item}: expected KEY=VALUE with KEY a template setting")
        changes[key] = pkg.config.convert(key, value, f"--set={item}")
    settings = {
        "data_dir": str(data_dir),
        "device": args.device,
        "dtype": args.dtype,
        "max_iters": args.iters,
        "lr_decay_iters": args.lr_decay_iters,
        "eval_interval": args.eval_interval,
        "eval_iters": args.eval_iters,
        "plot": False,
        "always_save_checkpoint": False,
    }
    return pkg.config.replace(cfg, **(settings | changes))


def template_command(pkg, cfg, args, seed: int, out_dir: Path) -> list[str]:
    settings = {name: getattr(cfg, name) for name in SHARED}
    settings.update(
        preset=cfg.preset,
        recipe=cfg.recipe,
        dataset=cfg.dataset,
        data_dir=cfg.data_dir,
        out_dir=str(out_dir),
        seed=seed,
        max_iters=cfg.max_iters,
        lr_decay_iters=cfg.lr_decay_iters,
        eval_interval=cfg.eval_interval,
        eval_iters=cfg.eval_iters,
        always_save_checkpoint=False,
        plot=False,
        device=cfg.device,
        dtype=cfg.dtype,
        compile=args.compile,
    )
    return [sys.executable, "-m", pkg.name, "train"] + [
        f"--{key}={value}" for key, value in settings.items()
    ]


def nanogpt_command(pkg, cfg, args, work: Path) -> list[str]:
    device = pkg.device.pick_device(cfg.device)
    dtype = pkg.device.pick_dtype(device, cfg.dtype)
    compile = args.compile == "true" or (
        args.compile == "auto" and device.type == "cuda"
    )
    settings: dict[str, Any] = {name: getattr(cfg, name) for name in SHARED}
    settings.update(
        dataset=cfg.dataset,
        max_iters=cfg.max_iters,
        lr_decay_iters=cfg.lr_decay_steps,
        eval_interval=cfg.eval_interval,
        eval_iters=cfg.eval_iters,
        always_save_checkpoint=False,
        wandb_log=False,
        out_dir="out",
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        compile=compile,
    )
    command = [sys.executable, "train.py"]
    if (work / "config" / f"train_{args.preset}.py").is_file():
        command.append(f"config/train_{args.preset}.py")  # as train.py users run it
    # configurator.py checks each value's type against train.py's default: repr
    # keeps floats floats (0.0, not 0) and strings bare.
    for key, value in settings.items():
        text = value if isinstance(value, str) else repr(value)
        command.append(f"--{key}={text}")
    return command


def nanogpt_workdir(args, cfg, seed: int, root: Path) -> Path:
    """DIR's files in a run folder, the seed put in train.py's place, the corpus."""
    work = root / f"nanogpt-seed{seed}"
    work.mkdir(parents=True)
    source = args.nanogpt
    text = (source / "train.py").read_text()
    if text.count(NANOGPT_SEED_LINE) != 1:
        sys.exit(
            f"--nanogpt={source}: train.py should hold `{NANOGPT_SEED_LINE}` once"
            f" (found {text.count(NANOGPT_SEED_LINE)}); cannot set its seed"
        )
    seeded = NANOGPT_SEED_LINE.replace("1337", str(seed))
    (work / "train.py").write_text(text.replace(NANOGPT_SEED_LINE, seeded))
    for name in ("model.py", "configurator.py"):
        shutil.copyfile(source / name, work / name)
    config_file = source / "config" / f"train_{args.preset}.py"
    if config_file.is_file():
        (work / "config").mkdir()
        shutil.copyfile(config_file, work / "config" / config_file.name)
    write_nanogpt_data(Path(cfg.data_dir) / cfg.dataset, work / "data" / cfg.dataset)
    return work


# ------------------------------------------------------------------ variants
def run_variant(mode: str, package: str, rest: list[str]) -> int:
    """`learning_parity.py variant MODE PACKAGE --key=value ...`: the template's loop.

    Runs what `PACKAGE train --key=value ...` runs in one process (setup, then the
    loop), with the training offsets drawn another way, MODE:
    device_offsets: on a generator of the tokens' device seeded as the shipped
    CPU generators are (the template before issue 15: on CUDA a Philox stream
    with the seed torch.manual_seed gives the dropout generator); own_key: the
    same, keyed apart from that seed. Evaluations keep the shipped streams.
    After training, the val loss is estimated again over eval_iters batches of
    windows drawn from three other CPU seeds, to see how much the estimate moves
    with the windows drawn.
    """
    import importlib

    config = importlib.import_module(f"{package}.config")
    data = importlib.import_module(f"{package}.data")
    device = importlib.import_module(f"{package}.device")
    train = importlib.import_module(f"{package}.train")
    trainer = importlib.import_module(f"{package}.trainer")
    if mode not in VARIANTS.values():
        sys.exit(f"variant {mode!r}: expected one of {', '.join(VARIANTS.values())}")

    class Offsets(data.Batches):
        def __init__(
            self, tokens, block_size, batch_size, seed, name="train", slots=None
        ):
            super().__init__(tokens, block_size, batch_size, seed, name, slots)
            self.training_stream = slots is not None  # evaluate() passes none
            if self.training_stream:
                key = seed + (7_000_003 if mode == "own_key" else 0)
                self.generators = [
                    device.make_generator(tokens.device, data.stream_seed(key, slot))
                    for slot in self.slots
                ]

        def next(self):
            if not self.training_stream:
                return super().next()
            generator = self.generators[self.turn]
            self.turn = (self.turn + 1) % len(self.generators)
            starts = torch.randint(
                self.tokens.numel() - self.block_size,
                (self.batch_size, 1),
                generator=generator,
                device=generator.device,
            ).to(self.tokens.device, non_blocking=True)
            chunk = self.tokens[starts + self.window]
            return chunk[:, :-1], chunk[:, 1:]

    # create() (trainer.py) and evaluate() (train.py) look the class up there
    trainer.Batches = train.Batches = Offsets
    cfg = config.parse_args(rest)
    progress = train.Progress(cfg.max_iters, sys.stdout)
    t = trainer.setup(cfg, log=progress.print)
    runs = importlib.import_module(f"{package}.runs")
    stop = runs.StopSignal(announce=True, repeat_quits=True)
    with stop, train.cuda_fast_matmul(t.runtime.device):
        train._loop(t, progress, stop)
        val = t.splits["val"]
        window = torch.arange(cfg.block_size + 1, device=val.device)
        t.model.eval()
        for seed in (1, 2, 3):
            generator = torch.Generator().manual_seed(seed)
            total = torch.zeros((), device=val.device)
            with torch.no_grad():
                for _ in range(cfg.eval_iters):
                    starts = torch.randint(
                        val.numel() - cfg.block_size,
                        (cfg.batch_size, 1),
                        generator=generator,
                    ).to(val.device)
                    chunk = val[starts + window]
                    with t.runtime.autocast:
                        _, loss = t.step_model(chunk[:, :-1], chunk[:, 1:])
                    total += loss.float()
            mean = total.item() / cfg.eval_iters
            print(f"val on CPU-drawn windows [seed {seed}]: {mean:.4f}", flush=True)
    return 0


# ---------------------------------------------------------------- step check
def nanogpt_get_lr(source: Path, cfg) -> Any:
    """train.py's own get_lr, read out of the file, over this run's settings."""
    path = source / "train.py"
    tree = ast.parse(path.read_text(), str(path))
    found = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_lr"
    ]
    if len(found) != 1:
        sys.exit(f"--nanogpt: {path} has no top-level get_lr function")
    namespace: dict[str, Any] = {
        "math": math,
        "warmup_iters": cfg.warmup_iters,
        "learning_rate": cfg.learning_rate,
        "lr_decay_iters": cfg.lr_decay_steps,
        "min_lr": cfg.min_lr,
    }
    module = ast.Module(body=found, type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    return namespace["get_lr"]


def step_check(pkg, args, cfg_full, data_dir: Path) -> dict[str, Any]:
    """Same seed, same batches: the two programs' steps on the CPU, side by side."""
    steps = args.step_check_steps
    cfg = pkg.config.replace(
        cfg_full,
        device="cpu",
        dtype="float32",
        compile="false",
        n_layer=2,
        n_head=2,
        n_embd=64,
        block_size=32,
        batch_size=8,
        max_iters=steps,
        warmup_iters=steps // 3,
        lr_decay_iters=steps,
    )
    # The whole schedule of the real run, and of the short one.
    result: dict[str, Any] = {}
    diffs = []
    for c in (cfg_full, cfg):
        get_lr = nanogpt_get_lr(args.nanogpt, c)
        diffs += [abs(pkg.optim.lr_at(c, it) - get_lr(it)) for it in range(c.max_iters)]
    result["lr_max_abs_diff"] = max(diffs)

    runtime = pkg.device.make_runtime("cpu", "float32", "false")
    dataset = pkg.data.load_dataset(cfg)
    splits = {
        s: pkg.device.to_device(getattr(dataset, s), runtime.device)
        for s in ("train", "val")
    }
    trainer = pkg.trainer.create(cfg, runtime, splits, dataset.tokenizer_meta)
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []
    draw = trainer.batches.next

    def recording_next() -> tuple[torch.Tensor, torch.Tensor]:
        batch = draw()
        drawn.append(batch)
        return batch

    trainer.batches.next = recording_next  # the batches, to feed nanoGPT the same
    shape = pkg.trainer.model_config(cfg, dataset.tokenizer_meta).to_dict()
    nano = load_nanogpt_model(args.nanogpt)
    torch.manual_seed(cfg.seed)  # as train.py does before building its model
    with contextlib.redirect_stdout(io.StringIO()):  # its parameter-count prints
        model = nano.GPT(nano.GPTConfig(**shape))
        optimizer = model.configure_optimizers(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "cpu"
        )
    result["init_identical"] = all(
        torch.equal(a, b)
        for a, b in zip(trainer.model.parameters(), model.parameters(), strict=True)
    )
    # Each program's step in turn, so both draw dropout from the same CPU stream:
    # the template's random state is saved and put back around nanoGPT's step.
    rng = torch.get_rng_state()
    nano_rng = rng.clone()
    get_lr = nanogpt_get_lr(args.nanogpt, cfg)
    accum = cfg.gradient_accumulation_steps
    rows = []
    for it in range(steps):
        torch.set_rng_state(rng)
        for group in trainer.optimizer.param_groups:
            group["lr"] = pkg.optim.lr_at(cfg, it)
        first = len(drawn)
        mine = pkg.train.train_step(trainer).item()
        rng = torch.get_rng_state()
        torch.set_rng_state(nano_rng)
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        for X, Y in drawn[first:]:  # train.py's micro-step loop, its order
            # train.py's batches are stacked rows: contiguous, as .view needs
            _, loss = model(X.contiguous(), Y.contiguous())
            loss = loss / accum
            loss.backward()
        if cfg.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        nano_rng = torch.get_rng_state()
        theirs = loss.item() * accum  # train.py's printed loss: the last micro-step's
        rows.append((it, mine, theirs))
    result["losses"] = rows
    result["loss_max_abs_diff"] = max(abs(a - b) for _, a, b in rows)
    result["weights_max_abs_diff"] = max(
        (a - b).abs().max().item()
        for a, b in zip(trainer.model.parameters(), model.parameters(), strict=True)
    )
    return result


def print_step_check(r: dict[str, Any]) -> None:
    print(
        "step check (CPU, float32, 2 layers x 64 wide, the preset's dropout, same"
        " seed and batches):"
    )
    print(f"  initial weights identical: {r['init_identical']}")
    print(
        "  learning rate, largest difference over both schedules:"
        f" {r['lr_max_abs_diff']:.3g}"
    )
    shown = [
        row for row in r["losses"] if row[0] in (0, 1, 2) or row is r["losses"][-1]
    ]
    for it, mine, theirs in shown:
        print(f"  step {it}: template {mine:.6f}, nanoGPT {theirs:.6f}")
    print(
        f"  largest loss difference over {len(r['losses'])} steps:"
        f" {r['loss_max_abs_diff']:.3g}; largest weight difference after them:"
        f" {r['weights_max_abs_diff']:.3g}",
        flush=True,
    )


# --------------------------------------------------------------------- runs
def parse_log(program: str, text: str, warmup: int, iters: int) -> dict[str, Any]:
    evals: dict[int, tuple[float, float]] = {}
    times: list[float] = []
    cpu_windows: list[float] = []
    kind = "nanogpt" if program == "nanogpt" else "template"
    for line in text.splitlines():
        if m := EVAL_LINE.match(line):
            evals[int(m[1])] = (float(m[2]), float(m[3]))
        elif m := CPU_WINDOWS_LINE.match(line):
            cpu_windows.append(float(m[1]))
        elif m := ITER_LINE[kind].match(line):
            # the template numbers an iteration by the steps done, train.py by
            # the steps done before it
            done = int(m[1]) + (program == "nanogpt")
            if warmup < done <= iters:
                times.append(float(m[2]))
    return {
        "evals": evals,
        "ms_per_iter": statistics.median(times) if times else None,
        "timed": len(times),
        "val_cpu_windows": cpu_windows,
    }


def run_all(pkg, cfg, args, root: Path, out: Path) -> list[dict[str, Any]]:
    jobs = []
    for seed in args.seed_list:
        for program in args.program_list:
            if program != "nanogpt":
                work = root / f"{program}-seed{seed}"
                work.mkdir(parents=True)
                command = template_command(pkg, cfg, args, seed, work / "out")
                if program in VARIANTS:  # the same settings, through run_variant
                    command[1:4] = [SELF, "variant", VARIANTS[program], pkg.name]
            else:
                work = nanogpt_workdir(args, cfg, seed, root)
                command = nanogpt_command(pkg, cfg, args, work)
            jobs.append(
                {"program": program, "seed": seed, "work": work, "command": command}
            )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(args.project / "src"), env.get("PYTHONPATH", "")) if p
    )
    if args.parallel > 1:
        # Each compiling process would start a worker per core: share the cores.
        threads = max(1, (os.cpu_count() or 1) // args.parallel)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    started = time.perf_counter()
    pending, running, done = list(jobs), [], []
    try:
        schedule(pending, running, done, env, args, started, out)
    finally:  # interrupted: stop the runs this script started
        for job in running:
            job["proc"].kill()
            job["proc"].wait()
    return done


def schedule(pending, running, done, env, args, started: float, out: Path) -> None:
    """Start jobs up to --parallel at once; record each as it ends."""
    while pending or running:
        while pending and len(running) < args.parallel:
            job = pending.pop(0)
            job["log"] = out / f"{job['program']}-seed{job['seed']}.log"
            job["file"] = open(job["log"], "w")
            job["file"].write(" ".join(job["command"]) + "\n")
            job["file"].flush()
            job["begun"] = time.perf_counter()
            job["proc"] = subprocess.Popen(
                job["command"], cwd=job["work"], env=env, stdout=job["file"],
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            running.append(job)
        time.sleep(1)
        late = args.deadline_s and time.perf_counter() - started > args.deadline_s
        for job in list(running):
            rc = job["proc"].poll()
            if rc is None and late:
                job["proc"].kill()
                rc = job["proc"].wait()
                job["status"] = f"killed at --deadline_s={args.deadline_s:g}"
            if rc is None:
                continue
            running.remove(job)
            job["file"].close()
            job.setdefault("status", "ok" if rc == 0 else f"exit {rc}")
            text = job["log"].read_text(errors="replace")
            record = {
                "program": job["program"],
                "seed": job["seed"],
                "status": job["status"],
                "wall_s": round(time.perf_counter() - job["begun"], 1),
                "log": str(job["log"]),
                **parse_log(job["program"], text, args.warmup, args.iters),
            }
            if rc != 0:
                record["tail"] = text[-2000:]
            done.append(record)
            vals = {p: record["evals"].get(p, (None, None))[1] for p in args.point_list}
            extra = ""
            if record["val_cpu_windows"]:
                extra = f"; at the end on CPU-drawn windows {record['val_cpu_windows']}"
            print(
                f"{record['program']} seed {record['seed']}: {record['status']},"
                f" {record['wall_s']:.0f} s, val {vals}{extra}",
                flush=True,
            )
            if rc != 0:
                print(record["tail"], flush=True)
            write_json(out / "results.json", {"args": describe(args), "runs": done})


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def describe(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


# -------------------------------------------------------------------- table
def spread(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return (
        f"{mean:.4f} ± {sd:.4f} (n={len(values)}, {min(values):.4f}–{max(values):.4f})"
    )


def val_at(run: dict[str, Any], point: int) -> float | None:
    evals = {int(k): v for k, v in run["evals"].items()}
    value = evals.get(point, (None, None))[1]
    return None if value is None or math.isnan(value) else value


def print_table(runs: list[dict[str, Any]], args: argparse.Namespace) -> bool:
    """The runs, each program's mean and spread, and the comparison with nanoGPT.

    True when every template program ran at every point within --goal of nanoGPT.
    """
    points = args.point_list
    note = ""
    if args.parallel > 1:
        note = f" ({args.parallel} processes shared the device: not a speed figure)"
    print(
        f"\nval loss at iterations {', '.join(map(str, points))}; ms/iter: median"
        f" of the logged iterations after {args.warmup}{note}"
    )
    head = ["seed", "program"] + [f"val@{p}" for p in points] + ["ms/iter", "status"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    order = {p: i for i, p in enumerate(PROGRAMS)}
    for r in sorted(runs, key=lambda r: (r["seed"], order[r["program"]])):
        cells = [str(r["seed"]), r["program"]]
        for q in points:
            value = val_at(r, q)
            cells.append("-" if value is None else f"{value:.4f}")
        ms = r["ms_per_iter"]
        cells += ["-" if ms is None else f"{ms:.2f}", r["status"]]
        print("| " + " | ".join(cells) + " |")
    # {program: {point: {seed: val}}}
    by: dict[str, dict[int, dict[int, float]]] = {
        p: {q: {} for q in points} for p in PROGRAMS
    }
    for r in runs:
        for q in points:
            value = val_at(r, q)
            if value is not None:
                by[r["program"]][q][r["seed"]] = value
    present = [p for p in PROGRAMS if any(by[p][q] for q in points)]
    print("\nmean ± sample standard deviation (n, range):")
    for program in present:
        for q in points:
            print(f"  {program:20s} val@{q}: {spread(list(by[program][q].values()))}")
    if "nanogpt" not in present:
        return False
    met = True
    # The same seed gives both programs the same initial weights (and, eager,
    # the same dropout masks): the paired difference removes that share.
    print("\nminus nanoGPT (difference of means, standard error; paired by seed):")
    for program in [p for p in present if p != "nanogpt"]:
        for q in points:
            a, b = by[program][q], by["nanogpt"][q]
            if not a or not b:
                print(f"  {program} val@{q}: no value to compare")
                met = False
                continue
            diff = statistics.fmean(a.values()) - statistics.fmean(b.values())
            se = math.sqrt(
                (statistics.variance(a.values()) / len(a) if len(a) > 1 else math.nan)
                + (statistics.variance(b.values()) / len(b) if len(b) > 1 else math.nan)
            )
            pairs = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
            paired = "no common seed"
            if pairs:
                paired_se = (
                    statistics.stdev(pairs) / math.sqrt(len(pairs))
                    if len(pairs) > 1
                    else math.nan
                )
                paired = (
                    f"paired {statistics.fmean(pairs):+.4f} ± {paired_se:.4f}"
                    f" over {len(pairs)} seeds"
                )
            ok = abs(diff) <= args.goal
            met = met and ok
            print(
                f"  {program} val@{q}: {diff:+.4f} (± {se:.4f}); {paired};"
                f" goal |diff| <= {args.goal}: {'met' if ok else 'NOT met'}"
            )
    return met


# --------------------------------------------------------------------- main
def check_nanogpt(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--nanogpt names a checkout with the files these scripts run; resolved."""
    missing = [
        n for n in ("model.py", "train.py", "configurator.py")
        if not (args.nanogpt / n).is_file()
    ]  # fmt: skip
    if missing:
        parser.error(f"--nanogpt={args.nanogpt} lacks {', '.join(missing)}")
    args.nanogpt = args.nanogpt.resolve()


def prepare_run(args: argparse.Namespace, root: Path, iterations: str):
    """The project (--project, or baked into `root`), the one Config of both
    programs, the corpus prepared, the log folder; the run's header printed."""
    args.project = (args.project or bake(args.preset, root / "bake")).resolve()
    pkg = load_package(args.project)
    out = (args.out or root / "logs").resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = parity_config(pkg, args, root / "data")
    pkg.data.prepare(cfg, log=print)
    device = pkg.device.pick_device(cfg.device)
    print(
        f"torch {torch.__version__}, {pkg.device.device_name(device)} ({device});"
        f" preset {args.preset}, {iterations}, eval every {args.eval_interval} over"
        f" {args.eval_iters} batches, compile {args.compile}",
        flush=True,
    )
    return pkg, cfg, out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["variant"]:  # a template run started by run_all
        if len(argv) < 3:
            sys.exit("usage: learning_parity.py variant MODE PACKAGE --key=value ...")
        return run_variant(argv[1], argv[2], argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout")
    parser.add_argument("--project", type=Path, help="an already baked project")
    parser.add_argument("--preset", default="shakespeare_char")
    parser.add_argument("--seeds", default="1337,1338,1339,1340,1341")
    parser.add_argument("--programs", default="template,nanogpt")
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--eval_interval", type=int, default=500)
    parser.add_argument("--eval_iters", type=int, default=200)
    parser.add_argument("--lr_decay_iters", type=int, default=5000)
    parser.add_argument("--points", default="1000,5000")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--compile",
        default="auto",
        choices=("auto", "true", "false"),
        help="auto: each program's default on CUDA (the template's compile_mode=auto,"
        " train.py's compile=True), off elsewhere",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a template setting for both programs (n_layer=2, ...); repeatable",
    )
    parser.add_argument("--parallel", type=int, default=1, help="processes at once")
    parser.add_argument(
        "--deadline_s", type=float, default=0, help="kill runs still going after this"
    )
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--goal", type=float, default=0.005)
    parser.add_argument(
        "--step_check", default="on", choices=("on", "off", "only"),
        help="the same-seed same-batch CPU comparison of one step",
    )  # fmt: skip
    parser.add_argument("--step_check_steps", type=int, default=30)
    parser.add_argument(
        "--out", type=Path, help="logs and results.json (default: temp)"
    )
    parser.add_argument(
        "--merge",
        help="comma list of results.json files: print their runs as one table only",
    )
    args = parser.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    args.program_list = [p for p in args.programs.split(",") if p]
    args.point_list = [int(p) for p in args.points.split(",")]
    bad = [p for p in args.program_list if p not in PROGRAMS]
    if bad:
        parser.error(f"--programs: unknown {bad}; known: {', '.join(PROGRAMS)}")
    if any(p % args.eval_interval or p > args.iters for p in args.point_list):
        parser.error(
            f"--points={args.points}: each must be a multiple of --eval_interval="
            f"{args.eval_interval} and at most --iters={args.iters}"
        )
    if args.merge:  # the saved runs' own points, programs and warmup
        runs = []
        for name in args.merge.split(","):
            saved = json.loads(Path(name).read_text())
            runs += saved["runs"]
            args.parallel = max(args.parallel, int(saved["args"]["parallel"]))
            for key in ("point_list", "program_list", "warmup", "goal"):
                setattr(args, key, saved["args"][key])
        return 0 if print_table(runs, args) else 1
    needs_nanogpt = "nanogpt" in args.program_list or args.step_check != "off"
    if needs_nanogpt:
        if args.nanogpt is None:
            parser.error("--nanogpt=DIR is needed for nanogpt runs and the step check")
        check_nanogpt(parser, args)
    with tempfile.TemporaryDirectory(prefix="learning-parity-") as tmp:
        root = Path(tmp)
        pkg, cfg, out = prepare_run(
            args, root, f"{args.iters} iterations, lr_decay_iters {args.lr_decay_iters}"
        )
        if args.step_check != "off":
            check = step_check(pkg, args, cfg, root / "data")
            print_step_check(check)
            write_json(out / "step_check.json", check)
            if args.step_check == "only":
                return 0
        runs = run_all(pkg, cfg, args, root / "runs", out)
        met = print_table(runs, args)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
