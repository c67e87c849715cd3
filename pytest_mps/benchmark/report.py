"""The terminal tables: results per group, and a speedup table across devices.

Laid out as pytest-benchmark's: chosen columns, sorting, grouping, name
formats and a time unit per group (or one for all), numbers with thousands
separators, OPS, and each benchmark's median over its group's fastest; plus
our device columns and notes on results that should not be trusted.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_mps.benchmark.records import Table

Entry = Mapping[str, Any]

_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))
_SCALES = {name: scale for scale, name in _UNITS}
#: IQR over median above this: torch.utils.benchmark's warning threshold.
UNSTABLE = 0.10
_TIMES = ("min", "max", "mean", "stddev", "median", "iqr")
_HEADERS = {
    "device": "Device",
    "min": "Min",
    "max": "Max",
    "mean": "Mean",
    "stddev": "StdDev",
    "median": "Median",
    "iqr": "IQR",
    "outliers": "Outliers",
    "rounds": "Rounds",
    "iterations": "Iters",
    "ratio": "vs fastest",
    "dispatch": "Dispatch/complete",
    "verdict": "Verdict",
    "events": "Events median",
    "memory": "Peak memory",
}
CPU_NOTE = (
    "Dispatch/complete and Verdict are left out for the cpu: it has no queue "
    "to drain, so the host's time is the whole time and nothing is host- or "
    "device-bound."
)
EMULATED_NOTE = (
    "Times on mps are the CPU's: under --mps-emulate the device is emulated on "
    "the CPU, so they say nothing of a Mac's speed (Dispatch/complete, Verdict, "
    "Events and Peak memory are left out: the emulated device has no queue, "
    "events or memory of its own)."
)
RATIO_NOTE = (
    "Dispatch/complete: host time to queue the calls over the time until the "
    "device finished them; host-bound from 0.9 up (the device waits for "
    "Python), device-bound below."
)


def time_unit(seconds: float) -> tuple[float, str]:
    """The scale and name of the unit that shows ``seconds`` best."""
    for scale, name in _UNITS:
        if seconds >= scale:
            return scale, name
    return _UNITS[-1]


def format_time(seconds: float) -> str:
    """``12.3 us``, ``4.56 ms``: three significant figures in a fitting unit."""
    scale, name = time_unit(seconds)
    return f"{seconds / scale:.3g} {name}"


def natural_key(text: str) -> tuple[Any, ...]:
    """``test_mm[64]`` before ``test_mm[128]``: digit runs compare as numbers."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.split(r"(\d+)", text)
    )


def _memory(value: int | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:,.1f} MiB"


def render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A plain table: the first column left-aligned, the others right-aligned."""
    widths = [
        max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i])
        for i in range(len(header))
    ]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    out = [line(header), "-" * len(line(header))]
    out.extend(line(r) for r in rows)
    return out


# -- grouping and sorting -------------------------------------------------------------


def _func(name: str) -> str:
    return re.sub(r"\[.*?\]", "", name)


def _group_label(entry: Entry, by: str) -> str | None:
    if by == "group":
        group = entry.get("group")
        return f"group {group!r}" if group else None
    if by in ("name", "fullname"):
        return f"{by} {entry[by]}"
    if by == "func":
        return f"func {_func(str(entry['name']))}"
    if by == "fullfunc":
        return f"fullfunc {_func(str(entry['fullname']))}"
    if by == "device":
        return f"device {entry['extra_info'].get('device', 'cpu')}"
    if by == "param":
        return f"param {entry.get('param')}"
    param = by.split(":", 1)[1]
    value = (entry.get("params") or {}).get(param)
    return f"{by} {value}"


def _sort_key(sort: str) -> Callable[[Entry], Any]:
    if sort in ("name", "fullname"):
        return lambda e: natural_key(str(e[sort]))
    return lambda e: (e["stats"][sort], natural_key(str(e["name"])))


def groups(
    entries: Sequence[Entry], table: Table | None = None
) -> list[tuple[str | None, list[Entry]]]:
    """Entries split as ``table.group_by`` says, each group sorted."""
    table = table or Table()
    by_group: dict[str | None, list[Entry]] = defaultdict(list)
    for entry in entries:
        labels = [_group_label(entry, by) for by in table.group_by]
        named = [label for label in labels if label]
        by_group[", ".join(named) or None].append(entry)
    key = _sort_key(table.sort)
    return [
        (name, sorted(by_group[name], key=key))
        for name in sorted(by_group, key=lambda g: natural_key(g or ""))
    ]


def _display_name(entry: Entry, form: str) -> str:
    if form == "long":
        return str(entry["fullname"])
    name = str(entry["name"])
    return name.removeprefix("test_") if form == "short" else name


# -- the table ------------------------------------------------------------------------


def _columns(members: Sequence[Entry], table: Table) -> list[str]:
    if table.chosen:
        return list(table.columns)
    extras = [e["extra_info"] for e in members]
    devices = {str(x.get("device", "cpu")) for x in extras}
    wanted = {
        # All on the CPU: the title says so, and the column would repeat it.
        "device": devices != {"cpu"},
        "ratio": len(members) > 1,
        "dispatch": any(x.get("verdict") for x in extras),
        "verdict": any(x.get("verdict") for x in extras),
        "events": any(x.get("device_time_median") for x in extras),
        "memory": any(x.get("peak_memory") for x in extras),
    }
    return [c for c in table.columns if wanted.get(c, True)]


def _scale(members: Sequence[Entry], table: Table) -> tuple[float, str]:
    if table.time_unit != "auto":
        return _SCALES[table.time_unit], table.time_unit
    return time_unit(min(e["stats"]["min"] for e in members))


def _ops_scale(members: Sequence[Entry]) -> tuple[float, str]:
    low = min((e["stats"].get("ops") or 0.0) for e in members)
    for scale, name in ((1e6, "Mops/s"), (1e3, "Kops/s")):
        if low >= scale:
            return scale, name
    return 1.0, "ops/s"


def _cell(column: str, entry: Entry, scale: float, ops: float, fastest: float) -> str:
    stats, extra = entry["stats"], entry["extra_info"]
    if column in _TIMES:
        return f"{stats[column] / scale:,.4f}"
    if column in ("rounds", "iterations"):
        return f"{stats[column]:,}"
    if column == "outliers":
        return str(stats.get("outliers", "-"))
    if column == "ops":
        return f"{(stats.get('ops') or 0.0) / ops:,.4f}"
    if column == "device":
        device = str(extra.get("device", "cpu"))
        return f"{device} (emulated)" if extra.get("emulated") else device
    if column == "ratio":
        return f"{stats['median'] / fastest:,.2f}" if fastest else "-"
    if column == "dispatch":
        ratio = extra.get("dispatch_ratio")
        return "n/a" if ratio is None or not extra.get("verdict") else f"{ratio:.2f}"
    if column == "verdict":
        return str(extra.get("verdict") or "n/a")
    if column == "events":
        events = extra.get("device_time_median")
        if events is None:
            return "n/a"
        mark = "" if extra.get("events_agree") in (True, None) else " !"
        return f"{events / scale:,.4f}{mark}"
    return _memory(extra.get("peak_memory"))


def results_table(
    entries: Sequence[Entry],
    table: Table | None = None,
    changes: Mapping[str, float] | None = None,
) -> list[str]:
    """pytest-benchmark-like tables, one per group, with our sync-aware columns.

    ``changes`` maps a fullname to its median's change against the baseline.
    """
    table = table or Table()
    lines: list[str] = []
    notes: list[str] = []
    cpu_left_out = False
    for group, members in groups(entries, table):
        scale, unit = _scale(members, table)
        ops_scale, ops_unit = _ops_scale(members)
        columns = _columns(members, table)
        references = [
            e for e in members if (e.get("options") or {}).get("baseline", True)
        ]
        fastest = min(e["stats"]["median"] for e in references or members)
        header = [f"Name (time in {unit})"]
        header += [f"OPS ({ops_unit})" if c == "ops" else _HEADERS[c] for c in columns]
        if changes is not None:
            header.append("vs baseline")
        rows = []
        for e in members:
            row = [_display_name(e, table.name)]
            row += [_cell(c, e, scale, ops_scale, fastest) for c in columns]
            if changes is not None:
                change = changes.get(str(e["fullname"]))
                row.append("new" if change is None else f"{change * 100:+,.1f}%")
            rows.append(row)
            notes.extend(_notes(e))
        shown = set(columns)
        on_cpu = any(not e["extra_info"].get("verdict") for e in members)
        if on_cpu and ("dispatch" in shown or "verdict" in shown or not table.chosen):
            cpu_left_out = True
        title = f" pytest-mps benchmark: {len(members)} measured"
        if "device" not in columns:
            devices = {str(e["extra_info"].get("device", "cpu")) for e in members}
            title += f" on {', '.join(sorted(devices))}"
        if any(e["extra_info"].get("emulated") for e in members):
            title += " (mps emulated: CPU times)"
        title += f" ({group}) " if group else " "
        rendered = render(header, rows)
        lines.append(title.center(len(rendered[0]), "-"))
        lines.extend(rendered)
        lines.append("")
    lines.extend(notes)
    if any(e["extra_info"].get("emulated") for e in entries):
        lines.append(EMULATED_NOTE)
    elif cpu_left_out:
        lines.append(CPU_NOTE)
    if any(e["extra_info"].get("verdict") for e in entries):
        lines.append(RATIO_NOTE)
    return lines


def _notes(entry: Entry) -> list[str]:
    extra = entry["extra_info"]
    stats = entry["stats"]
    name = entry["name"]
    notes = []
    if stats.get("median") and stats.get("iqr", 0) / stats["median"] > UNSTABLE:
        notes.append(
            f"! {name}: unstable: the IQR is {stats['iqr'] / stats['median']:.0%} "
            f"of the median (over {UNSTABLE:.0%}); something else ran meanwhile, "
            "or the work itself varies"
        )
    if extra.get("events_agree") is False:
        notes.append(
            f"! {name}: device events read "
            f"{format_time(extra['device_time_median'])}, synced wall time "
            f"{format_time(stats['median'])}: they disagree, so the "
            "wall time is reported (MPS event timing misbehaves in some "
            "releases, pytorch#196395)"
        )
    if extra.get("warmup_stable") is False:
        notes.append(
            f"! {name}: warmup did not settle within max_time "
            f"({extra.get('warmup_rounds')} rounds): the first rounds may be slow"
        )
    return notes


def device_table(entries: Sequence[Entry]) -> list[str]:
    """Median per device for tests timed on several devices, with speedups.

    The speedup is against the first device of the row (cpu when timed).
    """
    by_test: dict[str, dict[str, float]] = defaultdict(dict)
    order: list[str] = []
    for e in entries:
        extra = e["extra_info"]
        key = str(extra.get("base_name") or e["name"])
        if key not in by_test:
            order.append(key)
        by_test[key][str(extra.get("device", "cpu"))] = e["stats"]["median"]
    compared = sorted((k for k in order if len(by_test[k]) > 1), key=natural_key)
    if not compared:
        return []
    devices: list[str] = []
    for key in compared:
        for dev in by_test[key]:
            if dev not in devices:
                devices.append(dev)
    devices.sort(key=lambda d: (d != "cpu", d))
    rows = []
    for key in compared:
        times = by_test[key]
        reference = next(d for d in devices if d in times)
        row = [key]
        for dev in devices:
            if dev not in times:
                row.append("-")
            elif dev == reference:
                row.append(format_time(times[dev]))
            else:
                speedup = times[reference] / times[dev]
                row.append(f"{format_time(times[dev])} ({speedup:,.2f}x)")
        rows.append(row)
    fake = {
        str(e["extra_info"].get("device"))
        for e in entries
        if e["extra_info"].get("emulated")
    }
    names = [f"{d} (emulated: CPU time)" if d in fake else d for d in devices]
    table = render(["Name (median)", *names], rows)
    title = f" pytest-mps device comparison: speedup vs {devices[0]} "
    return [title.center(max(len(table[0]), len(title) + 8), "-"), *table, ""]
