"""The known-failure manifest: written from a run, pinning each failure's type."""

from __future__ import annotations

from pathlib import Path

import pytest

# Five tests that fail on a Mac (and under --mps-emulate), each its own way,
# and one that passes.
FIVE_FAILING = """
import pytest
import torch


def test_numpy(device):
    torch.ones(2, device=device).numpy()


def test_mixed(device):
    torch.ones(2, device=device) + torch.arange(2)


def test_float64(device):
    torch.ones(2, device=device, dtype=torch.float64)


def test_sum(device):
    assert torch.ones(2, device=device).sum().item() == 3


def test_lookup(device):
    {}["missing"]


def test_fine(device):
    assert torch.ones(2, device=device).sum().item() == 2
"""
MANIFEST = "known/{device}-macos{macos}.txt"


def test_a_written_manifest_makes_the_next_run_green_and_each_change_fails_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_five=FIVE_FAILING)
    args = [
        "--mps-emulate",
        "-p",
        "no:cacheprovider",
        f"--mps-known-failures={MANIFEST}",
    ]
    written = pytester.runpytest_subprocess(*args, "--mps-known-failures-write")
    written.assert_outcomes(failed=5, passed=1)
    written.stdout.fnmatch_lines(["*wrote 5 lines to known/mps-macosnewest.txt"])
    lines = (pytester.path / "known/mps-macosnewest.txt").read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "test_five.py::test_float64[mps] | TypeError | mps",
        "test_five.py::test_lookup[mps] | KeyError | mps",
        "test_five.py::test_mixed[mps] | RuntimeError | mps",
        "test_five.py::test_numpy[mps] | TypeError | mps",
        "test_five.py::test_sum[mps] | AssertionError | mps",
    ]

    green = pytester.runpytest_subprocess(*args)
    green.assert_outcomes(xfailed=5, passed=1)
    green.stdout.fnmatch_lines(
        [
            "pytest-mps known failures: 5 listed in known/mps-macosnewest.txt"
            " (format: node id | exception type | device)"
        ]
    )
    assert green.ret == 0

    # fix one, skip one, change one's exception type
    source = FIVE_FAILING.replace("== 3", "== 2")
    source = source.replace(
        "def test_mixed", '@pytest.mark.skip("later")\ndef test_mixed'
    )
    source = source.replace('{}["missing"]', "[][1]")
    pytester.makepyfile(test_five=source)
    changed = pytester.runpytest_subprocess(*args)
    assert changed.ret == pytest.ExitCode.TESTS_FAILED
    changed.assert_outcomes(xfailed=2, passed=1, failed=2, errors=1)
    changed.stdout.fnmatch_lines_random(
        [
            "test_five.py::test_sum[[]mps[]] is listed as a known failure "
            "(AssertionError, known/mps-macosnewest.txt:9) but passed now: remove "
            "its line*",
            "test_five.py::test_mixed[[]mps[]] is listed as a known failure "
            "(RuntimeError, known/mps-macosnewest.txt:7) but was skipped: update "
            "the file",
            "test_five.py::test_lookup[[]mps[]] is listed "
            "(known/mps-macosnewest.txt:6) as failing with KeyError but failed "
            "with IndexError: list index out of range",
            "pytest-mps known failures: 2 failed as listed in "
            "known/mps-macosnewest.txt, 3 changed",
        ]
    )


def test_a_message_substring_and_a_device_narrow_a_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_a="""
        import pytest

        def test_a(device):
            raise RuntimeError("MPS does not support cumsum")

        def test_b(device):
            raise RuntimeError("something else")

        def test_c(device):
            raise RuntimeError("only listed for mps")
        """
    )
    Path(pytester.path / "known.txt").write_text(
        "test_a.py::test_a[cpu] | RuntimeError | cpu | does not support\n"
        "test_a.py::test_b[cpu] | RuntimeError | cpu | does not support\n"
        "test_a.py::test_c[cpu] | RuntimeError | mps\n"
    )
    result = pytester.runpytest("--mps-known-failures=known.txt")
    result.assert_outcomes(xfailed=1, failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "test_a.py::test_b[[]cpu[]] is listed (known.txt:2) as failing with "
            "RuntimeError with 'does not support' but failed with RuntimeError: "
            "something else",
            "FAILED test_a.py::test_c[[]cpu[]] - RuntimeError: only listed for mps",
        ]
    )


def test_a_crash_under_isolation_is_pinned_by_its_signal(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_abort="""
        import os

        def test_abort():
            os.abort()

        def test_fine():
            pass
        """
    )
    args = ["--mps-isolate", "--mps-known-failures=known.txt", "-n", "2"]
    written = pytester.runpytest_subprocess(*args, "--mps-known-failures-write")
    written.assert_outcomes(failed=1, passed=1)
    assert (
        "test_abort.py::test_abort | crash:SIGABRT | cpu"
        in (pytester.path / "known.txt").read_text().splitlines()
    )
    again = pytester.runpytest_subprocess(*args)
    again.assert_outcomes(xfailed=1, passed=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "test_x.py::test_a  RuntimeError\n",
            "ERROR: --mps-known-failures=known.txt: *known.txt, line 1: "
            "'test_x.py::test_a  RuntimeError' is not 'node id | exception type "
            "| device'*",
        ),
        (
            "# a comment\n\ntest_x.py::test_a | RuntimeErorr | mps\n",
            "ERROR: *known.txt, line 3: unknown exception type 'RuntimeErorr'; did "
            "you mean RuntimeError?*",
        ),
        (
            "test_x.py::test_a | torch.NoSuchError | mps\n",
            "ERROR: *line 1: unknown exception type 'torch.NoSuchError': torch has "
            "no such exception",
        ),
        (
            "test_x.py::test_a | crash:SIGNOPE | mps\n",
            "ERROR: *line 1: unknown signal 'SIGNOPE'*",
        ),
        (
            "test_x.py::test_a | KeyError | gpu\n",
            "ERROR: *line 1: device 'gpu' is not one of mps, cuda, cpu, xpu, *",
        ),
        (
            "test_x.py::test_a | KeyError | mps\ntest_x.py::test_a | TypeError | mps\n",
            "ERROR: *line 2: test_x.py::test_a on mps is listed already, on line 1",
        ),
    ],
)
def test_a_bad_manifest_is_one_line_naming_the_file_and_line(
    pytester: pytest.Pytester, text: str, message: str
) -> None:
    (pytester.path / "known.txt").write_text(text)
    pytester.makepyfile("def test_it(): pass")
    result = pytester.runpytest("--mps-known-failures=known.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_missing_or_binary_manifest_says_what_to_do(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_it(): pass")
    missing = pytester.runpytest("--mps-known-failures=nope/{device}.txt")
    missing.stderr.fnmatch_lines(
        [
            "ERROR: --mps-known-failures=nope/{device}.txt: */nope/cpu.txt does not "
            "exist; write it from a run with --mps-known-failures-write"
        ]
    )
    (pytester.path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    binary = pytester.runpytest("--mps-known-failures=binary.txt")
    binary.stderr.fnmatch_lines(["ERROR: *binary.txt: not UTF-8 text*"])
    alone = pytester.runpytest("--mps-known-failures-write")
    alone.stderr.fnmatch_lines(
        ["ERROR: --mps-known-failures-write: give the file with --mps-known-failures*"]
    )


def test_pytest_fail_is_pinned_as_failed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fail="""
        import pytest

        def test_it():
            pytest.fail("not yet")
        """
    )
    args = ["--mps-known-failures=known.txt"]
    pytester.runpytest(*args, "--mps-known-failures-write").assert_outcomes(failed=1)
    listed = (pytester.path / "known.txt").read_text().splitlines()
    assert "test_fail.py::test_it | Failed | cpu" in listed
    pytester.runpytest(*args).assert_outcomes(xfailed=1)


# kornia's testing/known_failure_xfails/mps_float32.txt, in miniature: the
# same four tests listed right, one listed with the wrong type, one missing.
KORNIA_STYLE = (
    "# Exact failure baseline from a hosted macOS runner\n"
    "# Format: <exact exception type>\\t<pytest node ID>\n"
    "TypeError\ttest_five.py::test_float64[mps]\n"
    "KeyError\ttest_five.py::test_lookup[mps]\n"
    "RuntimeError\ttest_five.py::test_mixed[mps]\n"
    "TypeError\ttest_five.py::test_numpy[mps]\n"
    "RuntimeError\ttest_five.py::test_sum[mps]\n"
    "KeyError\ttest_five.py::test_fine[mps]\n"
)


def _verdicts(result: pytest.RunResult) -> dict[str, str]:
    verdicts = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "XFAIL", "SKIPPED") and "::" in rest:
            verdicts[rest.split(" ")[0]] = word
    return verdicts


def test_kornias_format_is_read_as_it_is_and_judges_as_its_converted_form(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_five=FIVE_FAILING)
    (pytester.path / "mps_float32.txt").write_text(KORNIA_STYLE)
    converted = [
        f"{nodeid} | {kind} | mps"
        for kind, nodeid in (
            line.split("\t")
            for line in KORNIA_STYLE.splitlines()
            if not line.startswith("#")
        )
    ]
    (pytester.path / "ours.txt").write_text("\n".join(converted) + "\n")
    args = ["--mps-emulate", "-p", "no:cacheprovider", "-rA"]
    tabs = pytester.runpytest_subprocess(*args, "--mps-known-failures=mps_float32.txt")
    tabs.stdout.fnmatch_lines(
        [
            "pytest-mps known failures: 6 listed in mps_float32.txt (format: "
            "kornia's <exception type><TAB><node id>, device mps from the file's "
            "name (mps_float32.txt))"
        ]
    )
    pipes = pytester.runpytest_subprocess(*args, "--mps-known-failures=ours.txt")
    assert _verdicts(tabs) == _verdicts(pipes)
    assert _verdicts(tabs) == {
        "test_five.py::test_float64[mps]": "XFAIL",
        "test_five.py::test_lookup[mps]": "XFAIL",
        "test_five.py::test_mixed[mps]": "XFAIL",
        "test_five.py::test_numpy[mps]": "XFAIL",
        "test_five.py::test_sum[mps]": "FAILED",  # an AssertionError, not listed so
        "test_five.py::test_fine[mps]": "FAILED",  # listed, but passed
    }
    tabs.stdout.fnmatch_lines(
        [
            "*test_sum[[]mps[]] is listed (mps_float32.txt:7) as failing with "
            "RuntimeError but failed with AssertionError*"
        ]
    )


def test_a_refreshed_kornia_file_keeps_its_format_and_its_opening_comments(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_five=FIVE_FAILING)
    (pytester.path / "mps_float32.txt").write_text(KORNIA_STYLE)
    result = pytester.runpytest_subprocess(
        "--mps-emulate",
        "-p",
        "no:cacheprovider",
        "--mps-known-failures=mps_float32.txt",
        "--mps-known-failures-write",
    )
    result.stdout.fnmatch_lines(["*wrote 5 lines to mps_float32.txt"])
    assert (pytester.path / "mps_float32.txt").read_text() == (
        "# Exact failure baseline from a hosted macOS runner\n"
        "# Format: <exact exception type>\\t<pytest node ID>\n"
        "TypeError\ttest_five.py::test_float64[mps]\n"
        "KeyError\ttest_five.py::test_lookup[mps]\n"
        "RuntimeError\ttest_five.py::test_mixed[mps]\n"
        "TypeError\ttest_five.py::test_numpy[mps]\n"
        "AssertionError\ttest_five.py::test_sum[mps]\n"
    )


def test_a_bad_kornia_line_names_the_format_the_file_is_in(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_five=FIVE_FAILING)
    (pytester.path / "mps_float32.txt").write_text(
        "TypeError\ttest_five.py::test_numpy[mps]\nKeyError test_five.py::x\n"
    )
    result = pytester.runpytest(
        "--mps-emulate",
        "-p",
        "no:cacheprovider",
        "--mps-known-failures=mps_float32.txt",
    )
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-known-failures=mps_float32.txt: *mps_float32.txt, line 2: "
            "'KeyError test_five.py::x' is not '<exception type><TAB><node id>', the "
            "format of the file's first entry"
        ]
    )
