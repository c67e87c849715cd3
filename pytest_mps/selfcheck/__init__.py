"""A self-check a Mac user runs in one command: ``python -m pytest_mps.selfcheck``.

No Mac has run pytest-mps's Mac-only paths here; every figure about Macs in
its code comes from public reports. This runs each of those paths on the
machine it is on (the macOS and GPU reads both ways, the fork server against
spawn on a three-test suite that uses the device, the probe, the cache
emptying, the shutdown watchdog) and a fixed corpus of small MPS cases, for
real where MPS is available and under ``--mps-emulate`` side by side, and
writes one Markdown and one JSON report: for each item what pytest-mps
expected and what this machine did, ready to paste into an issue. On Linux
the Mac reads have nothing to read and the real side does not run, so the
same items run through the emulated device: CI keeps the command working.

The report's format: :mod:`.report`.
"""
