"""``python -m pytest_mps.selfcheck [--out DIR]``: run every check, write the report."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from pytest_mps.selfcheck import checks, report


def main(argv: list[str] | None = None) -> int:
    """Run the checks one by one (each shown as it runs); 0 once the report is out."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_mps.selfcheck",
        description="Run pytest-mps's Mac-only paths here and write a report.",
    )
    parser.add_argument("--out", type=Path, default=Path("."), help="report folder")
    options = parser.parse_args(argv)
    from importlib.metadata import version

    items: list[report.Item] = []
    runs: list[Callable[[], report.Item | list[report.Item]]] = [
        *checks.CHECKS,
        checks.corpus_items,
    ]
    for check in runs:
        print(f"pytest-mps selfcheck: {check.__name__} ...", flush=True)
        try:
            found = check()
        except Exception as exc:  # noqa: BLE001 - an error is an item of the report
            found = report.Item(
                check.__name__, "no error", f"{type(exc).__name__}: {exc}", "error",
                {"traceback": traceback.format_exc()},
            )  # fmt: skip
        for item in found if isinstance(found, list) else [found]:
            items.append(item)
            print(f"  {item.verdict}: {item.name}: {item.observed}", flush=True)
    md, js = report.write(options.out, version("pytest-mps"), checks.machine(), items)
    print(f"pytest-mps selfcheck: wrote {md} and {js}; paste {md.name} into an issue")
    return 0


if __name__ == "__main__":
    sys.exit(main())
