"""``--mps-audit``'s hooks, registered by :mod:`.plugin` when the audit is on.

What the audit is and how it predicts: :mod:`.plugin`'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps.audit import ignores
from pytest_mps.audit.settings import (
    NEWEST_MACOS,
    AuditSettings,
    read_settings,
)

if TYPE_CHECKING:
    from pytest_mps.audit.recorder import Recorder
    from pytest_mps.ops import OpTable


class Expectations(NamedTuple):
    """PyTorch's MPS test lists attributed to aten op keys, or why not."""

    blamed: dict[str, Any]
    note: str
    source: str = ""
    lacking: int = 0
    unattributed: int = 0
    #: checks PyTorch's lists could not feed, each with why
    off: tuple[str, ...] = ()


settings_key = pytest.StashKey[AuditSettings]()
table_key: pytest.StashKey[OpTable] = pytest.StashKey()
expectations_key = pytest.StashKey[Expectations]()
_recorder_key: pytest.StashKey[Recorder] = pytest.StashKey()
#: the session's mps_audit_ignore ini lines
ini_ignores_key = pytest.StashKey[tuple[ignores.Ignore, ...]]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = config.stash[settings_key] = read_settings(config)
    from pytest_mps import backend
    from pytest_mps import ops as mps_ops

    if not backend.torch_installed():
        raise pytest.UsageError("--mps-audit: torch is not installed")
    if settings.check:
        if not backend.mps_built():
            raise pytest.UsageError(
                "--mps-audit-check needs a torch built with MPS (a Mac): it asks "
                "the MPS dispatcher; use --mps-audit alone here"
            )
    try:
        config.stash[table_key] = mps_ops.load_table()
    except ImportError as exc:
        raise pytest.UsageError(
            f"--mps-audit reads torch's native_functions.yaml with torchgen, "
            f"which needs PyYAML (pip install pyyaml): {exc}"
        ) from None
    except OSError as exc:
        raise pytest.UsageError(
            f"--mps-audit cannot read torch's native_functions.yaml: {exc}"
        ) from None
    config.stash[expectations_key] = load_expectations(
        config.stash[table_key], settings.macos
    )
    config.stash[ini_ignores_key] = ignores.parse_ini(config)


def load_expectations(table: OpTable, macos: tuple[int, int]) -> Expectations:
    """PyTorch's MPS test lists mapped onto aten ops; a note instead on bad input."""
    import sys

    from pytest_mps import ops as mps_ops
    from pytest_mps.audit import expectations as lists
    from pytest_mps.audit.rules import argument_rules

    rules = argument_rules(lambda op: table.predict(op).outcome)

    def explained(key: str) -> bool:
        op, _, rest = key.partition("|")
        dtype = rest.partition("|")[0]
        if op in rules or dtype in ("float64", "complex128"):
            return True
        return table.predict(op).outcome in mps_ops.PROBLEMS

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        path = lists.common_mps_path()
        parsed = lists.read_lists(path)
        traces, where = lists.load_traces(
            mps_ops.cache_dir(), table.torch_version, progress
        )
    except lists.SourceError as exc:
        return Expectations({}, f"PyTorch's MPS test lists not used: {exc}")
    found = lists.attribute(traces, parsed, macos, explained)
    return Expectations(
        found.blamed,
        "",
        f"{path}; OpInfo map: {where}",
        found.lacking,
        len(found.unattributed),
        tuple(parsed.checks_off()),
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    table = config.stash.get(table_key, None)
    if table is None:
        return None
    from pytest_mps import ops as mps_ops

    counts = table.counts()
    found = config.stash.get(expectations_key, None)
    if found is not None and found.note:
        lists = f"\nmps-audit: {found.note}; predicting from the yaml alone"
    elif found is not None:
        lists = (
            f"\nmps-audit: PyTorch's MPS test lists: {found.lacking} (OpInfo, "
            f"dtype) failures, {len(found.blamed)} attributed (op, dtype) keys, "
            f"{found.unattributed} left to the argument rules"
        )
    else:
        lists = ""
    for why in found.off if found is not None else ():
        lists += f"\nmps-audit: {why}"
    for why in table.contradictions():
        lists += f"\nmps-audit: correction contradicted by torch's own tables: {why}"
    macos = config.stash[settings_key].macos
    target = "newest" if macos == NEWEST_MACOS else f"{macos[0]}.{macos[1]}"
    return (
        f"mps-audit: {config.stash[settings_key].level}; op table of torch "
        f"{table.torch_version} ({len(table.codes)} overloads: "
        f"{counts.get(mps_ops.MPS_KERNEL, 0)} MPS, "
        f"{counts.get(mps_ops.COMPOSITE, 0)} composite, "
        f"{counts.get(mps_ops.FALLBACK, 0) + counts.get(mps_ops.FORCED_FALLBACK, 0)} "
        f"fall back) from {table.source} in {table.seconds * 1000:.0f} ms; "
        f"macOS {target}" + lists
    )


# -- watching one test ----------------------------------------------------------


def allowed_ops(item: pytest.Item) -> frozenset[str] | None:
    """Ops ``mps_allow_fallback`` (marker or ini list) allows; None: every op.

    The marker and ini list belong to :mod:`pytest_mps.watch.fallback`; its parsing
    is reused so both features read them alike.
    """
    from pytest_mps.watch import fallback

    return fallback.allowed_ops_for(item)


@pytest.hookimpl
def pytest_mps_watch_ops(item: pytest.Item) -> Any:
    config = item.config
    table = config.stash.get(table_key, None)
    if table is None:
        return None
    silenced = config.stash.get(ini_ignores_key, ())
    marked = ignores.parse_marker(item)
    if marked is not None:
        silenced = (marked, *silenced)
    from pytest_mps.audit.recorder import Recorder
    from pytest_mps.devices import devices_key, emulated
    from pytest_mps.watch.settings import expected_syncs_key

    callspec = getattr(item, "callspec", None)
    device = callspec.params.get("device") if callspec is not None else None
    session = config.stash.get(devices_key, ["cpu"])
    found = config.stash.get(expectations_key, None)
    recorder = Recorder(
        table,
        keep_ops=config.stash[settings_key].check,
        # on CPU nothing waits, but the same line would wait on MPS
        count_cpu=str(device or session[0]) == "cpu",
        # a CPU-only session mixes only what a test puts elsewhere itself
        # (meta tensors, a device= it names), which raises or syncs on MPS too
        mixed=True,
        expected=found.blamed if found is not None else None,
        macos=config.stash[settings_key].macos,
        expected_syncs=config.stash.get(expected_syncs_key, ()),
        ignores=silenced,
        device_only=emulated(config),
    )
    item.stash[_recorder_key] = recorder
    return recorder


# trylast: inside the watch plugin's wrapper, which makes the recorder.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    recorder = item.stash.get(_recorder_key, None)
    if recorder is None:
        return (yield)
    with recorder.calls():
        result = yield
    if item.config.stash[settings_key].level != "error":
        return result
    from pytest_mps.audit.problems import is_problem

    problems = [r for r in recorder.results(allowed_ops(item)) if is_problem(r)]
    if problems:
        from pytest_mps.audit.summary import describe

        lines = [f"  {describe(r)}\n    first at {r['first']}" for r in problems]
        pytest.fail(
            "--mps-audit=error: this test would not run cleanly on MPS:\n"
            + "\n".join(lines)
            + "\n  (on purpose? @pytest.mark.mps_audit_ignore(name, reason=...))",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    recorder = item.stash.get(_recorder_key, None)
    if recorder is not None and call.when == "call":
        from pytest_mps.audit.summary import OPS_PROPERTY, PROPERTY

        report.user_properties.append((PROPERTY, recorder.results(allowed_ops(item))))
        if recorder.ops is not None:
            report.user_properties.append((OPS_PROPERTY, sorted(recorder.ops)))
    return report


# -- the session's summary --------------------------------------------------------


def _lists_summary(config: pytest.Config) -> dict[str, Any]:
    found = config.stash.get(expectations_key, None)
    if found is None:
        return {}
    return {
        "note": found.note,
        "source": found.source,
        "lacking": found.lacking,
        "attributed_keys": len(found.blamed),
        "unattributed": found.unattributed,
    }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    table = config.stash.get(table_key, None)
    if table is None:
        return
    from pytest_mps import ops as mps_ops
    from pytest_mps.audit import summary

    per_test, ops = summary.collect(terminalreporter.stats)
    tables = summary.write(
        terminalreporter, config.rootpath, table.torch_version, per_test
    )
    data: dict[str, Any] = {
        "level": config.stash[settings_key].level,
        "torch": table.torch_version,
        "yaml_sha256": table.yaml_sha256,
        "table_source": table.source,
        "table_seconds": table.seconds,
        "macos": list(config.stash[settings_key].macos),
        "pytorch_lists": _lists_summary(config),
        "tests": per_test,
        **tables,
        "corrections": [
            {**dataclasses.asdict(fix), "applies": fix.applies_to(table.version)}
            for fix in mps_ops.CORRECTIONS
        ],
    }
    if config.stash[settings_key].check:
        write = terminalreporter.write_line
        differences = mps_ops.compare_with_dispatcher(table, ops)
        write(f"--mps-audit-check: {len(ops)} ops compared, {len(differences)} differ")
        for diff in differences:
            write(
                f"  {diff['op']}: predicted {diff['predicted']} ({diff['rule']}), "
                f"the MPS dispatcher says {diff['dispatcher']}"
            )
        data["check"] = {"ops": len(ops), "differences": differences}
    from pytest_mps.report import add_report_section

    add_report_section(config, "mps_audit", data)
