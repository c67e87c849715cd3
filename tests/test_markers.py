"""Device markers: mps, skip_device, xfail_device, devices."""

from __future__ import annotations

import pytest


def test_markers_are_listed_by_pytest_markers(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.mps: the test needs the MPS device*",
            "@pytest.mark.skip_device(*devices, reason=None): *",
            "@pytest.mark.xfail_device(*devices, reason=None, strict=False): *",
            "@pytest.mark.devices(*devices): *",
        ]
    )


def test_markers_are_clean_under_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps
        def test_a(): pass

        @pytest.mark.skip_device("mps", reason="r")
        @pytest.mark.xfail_device("cuda", reason="r")
        @pytest.mark.devices("cpu")
        def test_b(device): pass
        """
    )
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=1, skipped=1)


def test_mps_marker_skips_off_mps_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps
        def test_needs_mps():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED * needs MPS: run with --mps on an Apple-silicon Mac (this session "
            "runs on cpu)"
        ]
    )


def test_skip_device_skips_only_the_named_device(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.skip_device("cpu", reason="slow on cpu")
        def test_skipped(device):
            raise AssertionError("must not run")

        @pytest.mark.skip_device("mps:0", reason="mps bug")
        def test_runs(device):
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * slow on cpu"])


def test_xfail_device_expects_failure_and_honours_strict(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.xfail_device("cpu", reason="known cpu bug")
        def test_fails(device):
            assert False

        @pytest.mark.xfail_device("cpu", reason="fixed now", strict=True)
        def test_passes_strict(device):
            pass

        @pytest.mark.xfail_device("mps", reason="mps only")
        def test_other_device(device):
            assert False
        """
    )
    result = pytester.runpytest("-rxX")
    result.assert_outcomes(xfailed=1, failed=2)
    result.stdout.fnmatch_lines(["*XPASS(strict)*fixed now*"])
    result.stdout.fnmatch_lines(["_* test_other_device[[]cpu[]] _*"])
    result.stdout.fnmatch_lines(["XFAIL *test_fails[[]cpu[]] - known cpu bug"])


def test_devices_marker_restricts_the_parametrization(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.devices("mps")
        def test_mps_only(device):
            raise AssertionError("must not run on cpu")

        @pytest.mark.devices("cpu", "mps")
        def test_cpu_or_mps(device):
            assert device.type == "cpu"
        """
    )
    result = pytester.runpytest("-v", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*test_cpu_or_mps[[]cpu[]] PASSED*",
            "SKIPPED * restricted by @pytest.mark.devices to mps; this session runs "
            "on cpu",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        (
            'skip_device("tpu")',
            "skip_device on *::test_it[[]cpu[]]: 'tpu' is not a device",
        ),
        (
            "xfail_device()",
            "xfail_device on *::test_it[[]cpu[]]: name at least one device",
        ),
        (
            'skip_device("cpu", because="x")',
            "skip_device on *: unexpected argument(s) [[]'because'[]]",
        ),
        (
            'xfail_device("cpu", strict="yes")',
            "xfail_device on *: strict must be True or False, got 'yes'",
        ),
        ('devices("auto")', "devices on *::test_it[[]cpu[]]: 'auto' is not allowed"),
        ("devices(3)", "devices on *::test_it[[]cpu[]]: 3 is not a device name"),
    ],
)
def test_bad_marker_arguments_fail_the_test_naming_marker_and_test(
    pytester: pytest.Pytester, mark: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{mark}
        def test_it(device):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*@pytest.mark.{message}*"])
