"""`{{ cookiecutter.project_slug }} COMMAND --key=value ...`: prepare, train, sample, bench."""

from __future__ import annotations

import difflib
import signal
import sys
from collections.abc import Callable, Sequence

from .config import Config, help_text, parse_args, typed_settings
from .errors import ConfigError, ProjectError

PROG = "{{ cookiecutter.project_slug }}"
USAGE = f"""usage: {PROG} COMMAND [--key=value ...]

commands:
  prepare   tokenize a text into data_dir/dataset (the embedded Shakespeare by
            default; --tokenizer=gpt2 for GPT-2 BPE; --input_file=FILE for yours)
  train     train from scratch, or --init_from=resume
  sample    generate text from out_dir/ckpt.pt
  bench     time the training step on random tokens

`{PROG} COMMAND --help` lists every setting with its default."""


def _prepare(cfg: Config, args: Sequence[str]) -> int:
    from .data import prepare

    given = "dataset" in typed_settings(args, with_preset=False)
    prepare(cfg, dataset_given=given)
    return 0


def _train(cfg: Config, args: Sequence[str]) -> int:
    from .train import train

    result = train(cfg, typed=typed_settings(args))
    # Stopped by a signal (and checkpointed): the shell's usual 128 + signal.
    return 128 + signal.Signals[result.stopped_by] if result.stopped_by else 0


def _sample(cfg: Config, args: Sequence[str]) -> int:
    from .sample import sample

    sample(cfg, typed=typed_settings(args))
    return 0


def _bench(cfg: Config, args: Sequence[str]) -> int:
    from .bench import bench

    bench(cfg)
    return 0


COMMANDS: dict[str, Callable[[Config, Sequence[str]], int]] = {
    "prepare": _prepare,
    "train": _train,
    "sample": _sample,
    "bench": _bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"{PROG}: unknown command {command!r}{hint}\n\n{USAGE}", file=sys.stderr)
        return 2
    if "-h" in rest or "--help" in rest:
        print(help_text(command))
        return 0
    try:
        return COMMANDS[command](parse_args(rest), rest)
    except ConfigError as exc:
        print(f"{PROG} {command}: error: {exc}", file=sys.stderr)
        return 2
    except ProjectError as exc:
        print(f"{PROG} {command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG} {command}: interrupted", file=sys.stderr)
        return 130
