"""``--mps-audit``: predict, on a machine without a Mac, what a suite would do on MPS.

Each test's aten ops (seen through the one watch mode of :mod:`pytest_mps.watch.mode`,
after decomposition) are looked up in the installed torch's own op table
(:mod:`pytest_mps.audit.ops`), and their tensors' dtypes checked against what MPS
can hold. Findings travel on ``report.user_properties`` (so pytest-xdist works),
are listed per test and as a session table in the terminal summary, and go to
the ``--mps-report`` JSON under ``"mps_audit"``. ``--mps-audit=error`` fails
the tests with findings that ``@pytest.mark.mps_allow_fallback`` does not allow.

Sources, in order (each finding names its rule, source and certainty): the
argument rules of :mod:`pytest_mps.audit.rules`, the op table, and PyTorch's
own MPS test lists for the installed torch (:mod:`pytest_mps.audit.expectations`;
when they cannot be read, a one-line note says so and the yaml alone decides).
``--mps-audit-macos`` sets the macOS the prediction is for (default: newest).

On a Mac, ``--mps-audit-check`` compares each prediction for the ops the suite
ran with the dispatcher's own registrations and prints where they differ.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps.options import argparse_type, choice

if TYPE_CHECKING:
    from pytest_mps.audit.ops import OpTable
    from pytest_mps.audit.recorder import Recorder

AUDIT_HELP = (
    "predict what the suite would do on MPS from the ops each test runs here: "
    "ops that fall back to the CPU or raise, dtypes MPS cannot hold. "
    "--mps-audit=off (default), --mps-audit=report (list findings), "
    "--mps-audit=error (also fail those tests). A bare --mps-audit means report."
)
AUDIT_CHECK_HELP = (
    "on a Mac (torch built with MPS): compare the audit's prediction for every "
    "op the suite ran with the MPS dispatcher's registrations; print differences."
)
MACOS_HELP = (
    "the macOS version the audit predicts for, like 14.4 (default: the newest): "
    "bfloat16 and complex need 14.0, some PyTorch expectations depend on it"
)
LEVELS = ("off", "report", "error")
#: Major macOS versions MPS runs on (12.3 is the first with MPS).
MACOS_MAJORS = (12, 13, 14, 15, 26)
NEWEST_MACOS = (99, 0)
PROPERTY = "pytest_mps_audit"
OPS_PROPERTY = "pytest_mps_audit_ops"


class AuditSettings(NamedTuple):
    """The session's audit level and whether to check against the dispatcher."""

    level: str
    check: bool
    macos: tuple[int, int] = NEWEST_MACOS


class Expectations(NamedTuple):
    """PyTorch's MPS test lists attributed to aten op keys, or why not."""

    blamed: dict[str, Any]
    note: str
    source: str = ""
    lacking: int = 0
    unattributed: int = 0


settings_key = pytest.StashKey[AuditSettings]()
table_key: pytest.StashKey[OpTable] = pytest.StashKey()
expectations_key = pytest.StashKey[Expectations]()
_recorder_key: pytest.StashKey[Recorder] = pytest.StashKey()


parse_level = choice(LEVELS)


def parse_macos(value: str, where: str) -> tuple[int, int]:
    """``"14.4"`` -> (14, 4); ``"newest"``/``""`` -> the newest; else ValueError."""
    text = value.strip().lower()
    if text in ("", "newest", "latest"):
        return NEWEST_MACOS
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{where}: {value!r} is not a macOS version (like 14.4 or 15)")
    major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    if major not in MACOS_MAJORS and major < max(MACOS_MAJORS):
        known = ", ".join(str(m) for m in MACOS_MAJORS)
        raise ValueError(f"{where}: {value!r} is not a macOS version (known: {known})")
    if (major, minor) < (12, 3):
        raise ValueError(f"{where}: {value!r}: MPS needs macOS 12.3 or newer")
    return major, minor


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps")
    # A bare --mps-audit is a flag; its levels are whole option strings
    # (--mps-audit=error), which argparse matches before splitting at "=", so
    # the word after a bare --mps-audit is never taken as its value: it stays
    # a path (pytest --mps-audit tests/).
    group.addoption(
        "--mps-audit",
        dest="mps_audit",
        action="store_const",
        const="report",
        default=None,
        help=AUDIT_HELP,
    )
    for level in LEVELS:
        group.addoption(
            f"--mps-audit={level}",
            dest="mps_audit",
            action="store_const",
            const=level,
            help=argparse.SUPPRESS,
        )
    group.addoption(
        "--mps-audit-check",
        dest="mps_audit_check",
        action="store_true",
        default=None,
        help=AUDIT_CHECK_HELP,
    )
    group.addoption(
        "--mps-audit-macos",
        dest="mps_audit_macos",
        default=None,
        type=argparse_type(parse_macos, "--mps-audit-macos"),
        metavar="VERSION",
        help=MACOS_HELP,
    )
    parser.addini("mps_audit", AUDIT_HELP, default="off")
    parser.addini("mps_audit_macos", MACOS_HELP, default=None)
    parser.addini("mps_audit_check", AUDIT_CHECK_HELP, type="bool", default=False)


def _settings(config: pytest.Config) -> AuditSettings:
    level = config.getoption("mps_audit")
    if level is None:
        where = f"ini option mps_audit in {config.inipath}"
        try:
            level = parse_level(str(config.getini("mps_audit")), where)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    check = config.getoption("mps_audit_check")
    if check is None:
        check = bool(config.getini("mps_audit_check"))
    if check and level == "off":
        level = "report"
    macos = config.getoption("mps_audit_macos")
    if macos is None:
        where = f"ini option mps_audit_macos in {config.inipath}"
        try:
            macos = parse_macos(str(config.getini("mps_audit_macos") or ""), where)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return AuditSettings(level, bool(check), macos)


def pytest_configure(config: pytest.Config) -> None:
    settings = config.stash[settings_key] = _settings(config)
    if settings.level == "off":
        return
    from pytest_mps import backend
    from pytest_mps.audit import ops as mps_ops

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


def load_expectations(table: OpTable, macos: tuple[int, int]) -> Expectations:
    """PyTorch's MPS test lists mapped onto aten ops; a note instead on bad input."""
    import sys

    from pytest_mps.audit import expectations as lists
    from pytest_mps.audit import ops as mps_ops
    from pytest_mps.audit.rules import ARGUMENT_RULES

    def explained(key: str) -> bool:
        op, _, rest = key.partition("|")
        dtype = rest.partition("|")[0]
        if op in ARGUMENT_RULES or dtype in ("float64", "complex128"):
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
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    table = config.stash.get(table_key, None)
    if table is None:
        return None
    from pytest_mps.audit import ops as mps_ops

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
    from pytest_mps.audit.recorder import Recorder
    from pytest_mps.devices import devices_key
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
        # on a CPU-only session every tensor is on the CPU: nothing to mix
        mixed=any(d != "cpu" for d in session),
        expected=found.blamed if found is not None else None,
        macos=config.stash[settings_key].macos,
        expected_syncs=config.stash.get(expected_syncs_key, ()),
    )
    item.stash[_recorder_key] = recorder
    return recorder


def _describe(row: Mapping[str, Any]) -> str:
    from pytest_mps.audit import ops as mps_ops

    origin = f"[{row.get('rule', row['kind'])}; {row.get('certainty', '')}"
    origin += f"; {row['source']}]" if row.get("source") else "]"
    if row["kind"] == "dtype":
        return f"{row['name']} (in {row['op']}): {row['why']} {origin}"
    meaning = mps_ops.MEANING[row["outcome"]]
    return f"{row['name']}: {meaning} ({row['why']}) {origin}"


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
    from pytest_mps.audit.recorder import is_problem

    problems = [r for r in recorder.results(allowed_ops(item)) if is_problem(r)]
    if problems:
        lines = [f"  {_describe(r)}\n    first at {r['first']}" for r in problems]
        pytest.fail(
            "--mps-audit=error: this test would not run cleanly on MPS:\n"
            + "\n".join(lines),
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
        report.user_properties.append((PROPERTY, recorder.results(allowed_ops(item))))
        if recorder.ops is not None:
            report.user_properties.append((OPS_PROPERTY, sorted(recorder.ops)))
    return report


# -- the session's summary --------------------------------------------------------


def _collect(stats: Mapping[str, list[Any]]) -> tuple[dict[str, list[Any]], set[str]]:
    per_test: dict[str, list[Any]] = {}
    ops: set[str] = set()
    for reports in stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == PROPERTY:
                    per_test[report.nodeid] = list(value)
                elif name == OPS_PROPERTY:
                    ops.update(value)
    return per_test, ops


def session_rows(per_test: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """One row per op or dtype over the session: count, tests, first user line."""
    from pytest_mps.audit.recorder import is_problem

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for nodeid, findings in per_test.items():
        for found in findings:
            row = rows.get((found["kind"], found["name"]))
            if row is None:
                row = rows[(found["kind"], found["name"])] = {
                    **found,
                    "count": 0,
                    "tests": [],
                    "allowed": True,
                }
            row["count"] += found["count"]
            row["tests"].append(nodeid)
            row["allowed"] = row["allowed"] and found["allowed"]
    return sorted(
        rows.values(), key=lambda r: (not is_problem(r), r["kind"], r["name"])
    )


def _label(row: Mapping[str, Any]) -> str:
    label = str(row["outcome"])
    return label + (" (allowed)" if row.get("allowed") else "")


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
    from pytest_mps.audit import ops as mps_ops
    from pytest_mps.watch.locations import relative_location

    per_test, ops = _collect(terminalreporter.stats)
    rows = session_rows(per_test)
    root = config.rootpath
    write = terminalreporter.write_line
    terminalreporter.write_sep(
        "=", f"MPS audit: predicted from torch {table.torch_version}'s op table"
    )
    clean = sum(1 for found in per_test.values() if not found)
    write(f"{len(per_test)} tests audited, {clean} without findings")
    for nodeid, findings in per_test.items():
        if findings:
            write(nodeid)
        for row in findings:
            where = relative_location(row["first"], root)
            write(f"  {row['name']}  {_label(row)}  x{row['count']}  at {where}")
    if rows:
        width = max(len(row["name"]) for row in rows)
        write("")
        write(f"{'op or dtype':<{width}}  {'predicted':<28} count  tests  first at")
        for row in rows:
            where = relative_location(row["first"], root)
            write(
                f"{row['name']:<{width}}  {_label(row):<28} {row['count']:>5}  "
                f"{len(row['tests']):>5}  {where}"
            )
        write("")
        for outcome in sorted({r["outcome"] for r in rows if r["kind"] == "op"}):
            write(f"{outcome}: {mps_ops.MEANING[outcome]}")
        for row in rows:
            if row["kind"] != "op":
                write(f"{row['name']} ({row['outcome']}): {row['why']}")
    data: dict[str, Any] = {
        "level": config.stash[settings_key].level,
        "torch": table.torch_version,
        "yaml_sha256": table.yaml_sha256,
        "table_source": table.source,
        "table_seconds": table.seconds,
        "macos": list(config.stash[settings_key].macos),
        "pytorch_lists": _lists_summary(config),
        "tests": per_test,
        "session": rows,
        "corrections": [
            {**dataclasses.asdict(fix), "applies": fix.applies_to(table.version)}
            for fix in mps_ops.CORRECTIONS
        ],
    }
    if config.stash[settings_key].check:
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
