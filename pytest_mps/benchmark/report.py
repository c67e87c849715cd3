"""The terminal tables: results per group, and a speedup table across devices."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

Entry = Mapping[str, Any]

_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


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


def _memory(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:.1f} MiB"


def _render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
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


def groups(entries: Sequence[Entry]) -> list[tuple[str | None, list[Entry]]]:
    """Entries by group (as pytest-benchmark groups them), each sorted by name."""
    by_group: dict[str | None, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_group[entry.get("group")].append(entry)
    return [
        (name, sorted(by_group[name], key=lambda e: str(e["fullname"])))
        for name in sorted(by_group, key=lambda g: g or "")
    ]


def results_table(
    entries: Sequence[Entry], changes: Mapping[str, float] | None = None
) -> list[str]:
    """pytest-benchmark-like tables, one per group, with our sync-aware columns.

    ``changes`` maps a fullname to its median's change against the baseline.
    """
    lines: list[str] = []
    notes: list[str] = []
    for group, members in groups(entries):
        scale, unit = time_unit(min(e["stats"]["min"] for e in members))
        with_events = any(e["extra_info"].get("device_time_median") for e in members)
        with_memory = any(e["extra_info"].get("peak_memory") for e in members)
        header = [f"Name (time in {unit})", "Device", "Min", "Median", "Mean"]
        header += ["IQR", "Rounds", "Iters", "Dispatch/complete", "Verdict"]
        if with_events:
            header.append("Events median")
        if with_memory:
            header.append("Peak memory")
        if changes is not None:
            header.append("vs baseline")
        rows = []
        for e in members:
            stats, extra = e["stats"], e["extra_info"]
            row = [str(e["name"]), str(extra.get("device", "cpu"))]
            row += [f"{stats[k] / scale:.4f}" for k in ("min", "median", "mean", "iqr")]
            row += [str(stats["rounds"]), str(stats["iterations"])]
            ratio = extra.get("dispatch_ratio")
            row.append(
                "-" if ratio is None or not extra.get("verdict") else f"{ratio:.2f}"
            )
            row.append(str(extra.get("verdict") or "-"))
            if with_events:
                events = extra.get("device_time_median")
                mark = "" if extra.get("events_agree") in (True, None) else " !"
                row.append("-" if events is None else f"{events / scale:.4f}{mark}")
            if with_memory:
                row.append(_memory(extra.get("peak_memory")))
            if changes is not None:
                change = changes.get(str(e["fullname"]))
                row.append("new" if change is None else f"{change * 100:+.1f}%")
            rows.append(row)
            notes.extend(_notes(e))
        title = f" pytest-mps benchmark: {len(members)} measured"
        title += f" (group {group!r}) " if group else " "
        table = _render(header, rows)
        lines.append(title.center(len(table[0]), "-"))
        lines.extend(table)
        lines.append("")
    lines.extend(notes)
    if any(e["extra_info"].get("verdict") for e in entries):
        lines.append(
            "Dispatch/complete: host time to queue the calls over the time until "
            "the device finished them; host-bound from "
            "0.9 up (the device waits for Python), device-bound below."
        )
    return lines


def _notes(entry: Entry) -> list[str]:
    extra = entry["extra_info"]
    name = entry["name"]
    notes = []
    if extra.get("events_agree") is False:
        notes.append(
            f"! {name}: device events read "
            f"{format_time(extra['device_time_median'])}, synced wall time "
            f"{format_time(entry['stats']['median'])}: they disagree, so the "
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
    compared = [k for k in order if len(by_test[k]) > 1]
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
                row.append(f"{format_time(times[dev])} ({speedup:.2f}x)")
        rows.append(row)
    table = _render(["Name (median)", *devices], rows)
    title = f" pytest-mps device comparison: speedup vs {devices[0]} "
    return [title.center(max(len(table[0]), len(title) + 8), "-"), *table, ""]
