"""The pytest11 entry point: wires the concern modules together, holds no logic."""

from __future__ import annotations

pytest_plugins = [
    "pytest_mps.ownership",
    "pytest_mps.devices",
    "pytest_mps.environment",
    "pytest_mps.seeding",
    "pytest_mps.benchmark.plugin",
    "pytest_mps.report",
    "pytest_mps.watch.plugin",
    "pytest_mps.watch.findings",
    "pytest_mps.watch.fallback",
    "pytest_mps.watch.host_sync",
    "pytest_mps.watch.mixed_devices",
    "pytest_mps.watch.memory",
    "pytest_mps.audit.plugin",
]
