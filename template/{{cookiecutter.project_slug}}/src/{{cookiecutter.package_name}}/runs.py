"""What a run may do to out_dir: never replace another run's work unasked.

- A run from scratch refuses an out_dir that already holds a checkpoint, unless
  told `--overwrite=true`; then it removes the old run's files before its first
  step, so a later `--init_from=resume` can never pick up that older run.
  (One fixed `out_dir/ckpt.pt` rather than a folder per run: `sample`, resuming
  and scripts keep one predictable path, and nothing has to guess which of
  several runs is "the latest", which is how an older run gets resumed.)
- `--init_from=resume` continues the run with the checkpoint's settings; a
  setting given that differs from the checkpoint's in what the run computes is
  refused, each difference named, unless `--allow_changes` lists it.
- Ctrl-C (SIGINT) or SIGTERM lets the current step finish; the loop then writes a
  checkpoint and says how to resume. A second Ctrl-C quits at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from . import checkpoint
from .config import (
    FIELDS,
    MACHINE_SETTINGS,
    RUN_SETTINGS,
    SHAPE_SETTINGS,
    Config,
    allowed_changes,
    replace,
)
from .errors import CheckpointError, ConfigError

PROG = "{{ cookiecutter.project_slug }}"
# The files a run writes in out_dir; --overwrite removes these and nothing else.
RUN_FILES = ("ckpt.pt", "loss.csv", "loss.png")
# Never taken from the checkpoint when resuming: this machine's choices, and the
# settings that say what to do with the checkpoint itself.
NOT_INHERITED = (
    *MACHINE_SETTINGS,
    "eval_graph",
    "train_graph",
    "init_from",
    "overwrite",
    "allow_changes",
    "out_dir",
)


def describe(state: dict[str, Any]) -> str:
    """'iteration 63 of max_iters=100, preset 'tiny', dataset ..., val loss 4.25 at
    iteration 0': the checkpoint's last evaluation, with its iteration when it is
    older than the checkpoint (one saved on Ctrl-C between evaluations)."""
    cfg = state.get("config") or {}
    parts = [f"iteration {state['iter_num']}"]
    if "max_iters" in cfg:
        parts[0] += f" of max_iters={cfg['max_iters']}"
    for name in ("preset", "dataset"):
        if name in cfg:
            parts.append(f"{name} {cfg[name]!r}")
    if state.get("evals"):
        at, _, val = state["evals"][-1]
        when = "" if int(at) == int(state["iter_num"]) else f" at iteration {at}"
        parts.append(f"val loss {float(val):.4f}{when}")
    return ", ".join(parts)


def refuse_overwrite(cfg: Config) -> str | None:
    """Refuse a fresh run over an existing checkpoint; with --overwrite, describe it.

    Returns None when out_dir holds no checkpoint, else (with --overwrite) what
    the old checkpoint was, for the message when its files are removed.
    """
    path = checkpoint.path_in(cfg.out_dir)
    if not path.exists():
        return None
    try:
        what = describe(checkpoint.load(path, mmap=True))
    except CheckpointError as exc:
        what = f"unreadable: {exc}"
    if cfg.overwrite:
        return what
    raise ConfigError(
        f"{path} holds an earlier run ({what}); a new run would replace it."
        f" Continue that run with --init_from=resume, train into another folder"
        f" with --out_dir=NEW_FOLDER, or replace it with --overwrite=true"
    )


def remove_previous(out_dir: str, what: str, log: Callable[[str], Any]) -> None:
    """Delete the old run's files (--overwrite): nothing of it can be resumed."""
    folder = Path(out_dir)
    for name in RUN_FILES:
        (folder / name).unlink(missing_ok=True)
    log(f"removed the earlier run in {folder} ({what}), as --overwrite=true asks")


def resume_request(
    cfg: Config, saved: dict[str, Any], typed: frozenset[str] | None
) -> Config:
    """The settings of a resumed run: the checkpoint's, except those given.

    `typed` are the settings given on the command line; None means all of `cfg`
    was asked for (a program's own Config), so nothing is taken from `saved`.
    """
    if typed is None:
        return cfg
    inherited = {
        name: saved[name]
        for name in FIELDS
        if name in saved and name not in typed and name not in NOT_INHERITED
    }
    return replace(cfg, **inherited)


def _decay_steps(settings: dict[str, Any]) -> int:
    return int(settings["lr_decay_iters"] or settings["max_iters"])


def check_resume(cfg: Config, state: dict[str, Any], path: Path) -> list[str]:
    """Refuse a checkpoint whose run differs from `cfg`; return accepted changes.

    Every difference is named at once. The model's shape can never differ;
    the other settings that change what the run computes may, when
    --allow_changes names them.
    """
    saved, model = state["config"], state["model_config"]
    asked = cfg.to_dict()
    allowed = set(allowed_changes(cfg))
    shape, refused, accepted = [], [], []
    for name in SHAPE_SETTINGS:
        if model.get(name) != asked[name]:
            shape.append(
                f"  {name}: {model.get(name)!r} in the checkpoint, {asked[name]!r}"
                " asked for (the model's shape: its weights fit no other)"
            )
    for name in RUN_SETTINGS:
        if name == "lr_decay_iters":
            # 0 means "max_iters": compare the decay each one would really run.
            have, want = _decay_steps(saved), _decay_steps(asked)
            line = (
                f"lr_decay_iters: the learning rate decays over {have} steps in the"
                f" checkpoint, {want} asked for (lr_decay_iters=0 follows"
                f" max_iters); --lr_decay_iters={have} keeps the schedule"
            )
        else:
            # A checkpoint from before a setting existed ran its default.
            have, want = saved.get(name, FIELDS[name].default), asked[name]
            line = f"{name}: {have!r} in the checkpoint, {want!r} asked for"
        if have == want:
            continue
        if name in allowed:
            accepted.append(f"{name} {have!r} -> {want!r}")
        else:
            refused.append((name, f"  {line}"))
    if not shape and not refused:
        return accepted
    lines = [
        f"{path} ({describe(state)}) was trained with other settings than asked for:",
        *shape,
        *(line for _, line in refused),
        "To continue the run as it was, leave those settings out (the"
        " checkpoint's apply).",
    ]
    if refused:
        names = ",".join([*allowed_changes(cfg), *(name for name, _ in refused)])
        lines.append(f"To resume with the new values, add --allow_changes={names}.")
    lines.append(
        "To start a new run instead, pass --init_from=scratch and another --out_dir."
    )
    raise ConfigError("\n".join(lines))


def resume_hint(cfg: Config) -> str:
    """The command that continues this run from its checkpoint, where it ran.

    The machine settings are never read from a checkpoint (another machine may
    resume it), so those this run chose (not `auto`) are spelled out: a run
    stopped with --device=cpu resumes on the CPU, not on the GPU `auto` finds.
    """
    chosen = [
        f"--{name}={getattr(cfg, name)}"
        for name in MACHINE_SETTINGS
        if getattr(cfg, name) != "auto"
    ]
    return " ".join(
        [f"{PROG} train --init_from=resume", *chosen, f"--out_dir={cfg.out_dir}"]
    )


class StopSignal:
    """Ctrl-C (SIGINT) and SIGTERM during training ask the loop to stop cleanly.

    The handler only records the signal; the loop reads `signum` between steps
    (an attribute read: nothing on the hot path) and saves a checkpoint. A
    second Ctrl-C restores the usual handlers and raises KeyboardInterrupt, for
    a user who cannot wait for the step to end. A SIGTERM while stopping is
    not a second Ctrl-C. Under torchrun (`repeat_quits=False`) no repeat is:
    the agent passes the terminal's SIGINT on to its workers, which the
    terminal has already sent them, and kills them itself after 30 seconds.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: bool = True, repeat_quits: bool = True) -> None:
        self.signum = 0
        self.announce = announce
        self.repeat_quits = repeat_quits
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        # Python runs signal handlers in the main thread only. A signal the
        # parent ignores (a background job in a script ignores SIGINT) stays so.
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self.saved[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        self.saved = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum and signum == signal.SIGINT and self.repeat_quits:
            self.__exit__()
            raise KeyboardInterrupt
        if self.signum:
            return
        self.signum = signum
        if self.announce:
            again = " (press Ctrl-C again to quit without saving)"
            # os.write, not print: a handler may run in the middle of a print.
            os.write(
                2,
                f"\n{signal.Signals(signum).name}: finishing this step, then saving"
                f" a checkpoint{again if self.repeat_quits else ''}\n".encode(),
            )
