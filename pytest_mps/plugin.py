"""The pytest11 entry point: wires the concern modules together, holds no logic."""

from __future__ import annotations

pytest_plugins = [
    "pytest_mps.devices",
    "pytest_mps.environment",
    "pytest_mps.seeding",
    "pytest_mps.benchmark",
    "pytest_mps.report",
    "pytest_mps.watch",
    "pytest_mps.findings",
    "pytest_mps.fallback",
    "pytest_mps.host_sync",
    "pytest_mps.mixed_devices",
    "pytest_mps.memory",
    "pytest_mps.audit",
]
