"""The pytest11 entry point: wires the concern modules together, holds no logic.

Only light hook modules load at start-up; each family's front door registers
its heavier parts when a run or a test asks for them (see README, "How it is
built").
"""

from __future__ import annotations

pytest_plugins = [
    "pytest_mps.ownership",
    "pytest_mps.devices",
    "pytest_mps.environment",
    "pytest_mps.seeding",
    "pytest_mps.report",
    "pytest_mps.benchmark.plugin",
    "pytest_mps.watch.plugin",
    "pytest_mps.audit.plugin",
]
