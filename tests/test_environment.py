"""The session header, MPS variable warnings, mps_environment, and lazy torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_mps.mps_environment import variable_warnings


def test_header_names_torch_devices_and_mps_state(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok(device): pass")
    result = pytester.runpytest("--device", "cpu")
    result.stdout.fnmatch_lines(
        ["pytest-mps: torch *, devices: cpu; mps built: False, available: False"]
    )


def test_header_lists_and_flags_mps_variables(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    monkeypatch.setenv("PYTORCH_MPS_LOG_LEVEL", "debug")
    monkeypatch.setenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "auto")
    pytester.makepyfile("def test_ok(): pass")
    # the whole header is for a run that asks for pytest-mps
    result = pytester.runpytest("--mps-device=cpu")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps variables: PYTORCH_ENABLE_MPS_FALLBACK=1, "
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO=auto, PYTORCH_MPS_LOG_LEVEL=debug",
            "pytest-mps WARNING: PYTORCH_MPS_HIGH_WATERMARK_RATIO='auto' is not a "
            "number: PyTorch parses it as 0.0, which removes the memory limit "
            "altogether",
            "pytest-mps WARNING: PYTORCH_MPS_LOG_LEVEL does not exist in PyTorch*",
        ]
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "1.4"}, []),
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.0"}, ["removes the MPS memory"]),
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "2.5"}, ["outside 0..2"]),
        ({"PYTORCH_MPS_LOW_WATERMARK_RATIO": "-1"}, ["outside 0..2"]),
        # strtod reads the numeric prefix: "1.2x" is 1.2, which is fine
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "1.2x"}, []),
        ({"PYTORCH_MPS_PREFER_METAL": "0"}, ["still turns it on"]),
        ({"PYTORCH_MPS_PREFER_METAL": "1"}, []),
        ({"PYTORCH_MPS_FAST_MATH": "1"}, []),
        ({"PYTORCH_MPS_LOG_LEVEL": "1"}, ["does not exist in PyTorch"]),
        ({"PYTORCH_MPS_TURBO": "1"}, ["PYTORCH_MPS_TURBO is not read by PyTorch"]),
        ({"HOME": "/root"}, []),
    ],
)
def test_variable_warnings_follow_how_pytorch_reads_them(
    env: dict[str, str], expected: list[str]
) -> None:
    found = variable_warnings(env)
    assert len(found) == len(expected)
    for text, fragment in zip(found, expected, strict=True):
        assert fragment in text


def test_mps_environment_fixture_describes_the_session(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_env(mps_environment):
            assert mps_environment.devices == ("cpu",)
            assert mps_environment.torch_version.startswith("2.")
            assert mps_environment.mps_built is False
            assert mps_environment.header()[0].startswith("pytest-mps: torch")
        """
    )
    pytester.makeconftest("import torch")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


def test_plugin_does_not_import_torch_for_a_suite_that_never_uses_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_plain.py").write_text(
        "def test_plain():\n    assert 1 + 1 == 2\n"
    )
    # the engines: imported the first time a test asks for them, never here
    heavy = [
        "torch",
        "pytest_mps.benchmark.fixture",
        "pytest_mps.benchmark.timer",
        "pytest_mps.benchmark.storage",
        "pytest_mps.benchmark.stats",
        "pytest_mps.benchmark.report",
        "pytest_mps.watch.mode",
        "pytest_mps.watch.front",
        "pytest_mps.ops",
        "pytest_mps.audit.recorder",
        "pytest_mps.assertions",
    ]
    script = textwrap.dedent(
        f"""
        import sys, pytest
        code = pytest.main(["-p", "no:cacheprovider", {str(tmp_path)!r}])
        assert code == 0, code
        assert "pytest_mps.plugin" in sys.modules, "plugin not loaded"
        print("IMPORTED", [m for m in {heavy!r} if m in sys.modules])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "IMPORTED []" in out.stdout, out.stdout + out.stderr
    # and a guest's header: nothing about torch for a suite without it
    assert "pytest-mps" not in out.stdout


def test_a_run_that_asks_for_pytest_mps_says_what_it_knows_of_mps(
    tmp_path: Path,
) -> None:
    # a subprocess: torch is not loaded when the header is written
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--mps-seed=3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("pytest-mps:")]
    if sys.platform == "darwin":
        assert "mps built: " in line, line
    else:
        assert line.endswith(
            f"devices: cpu; mps: none on {sys.platform} (MPS needs an Apple-silicon "
            "Mac)"
        ), line
    assert "not checked" not in line and len(line) < 120
