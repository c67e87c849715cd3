"""Every pytest-mps option that takes one of a fixed set of values: a bad value
is one line that names the flag, the value, the closest valid one and all of
them, on the command line, with a space, and in the ini file."""

from __future__ import annotations

import pytest

# (arguments, the whole message after "ERROR: ")
COMMAND_LINE = [
    (
        ["--mps-fallback=eror"],
        "--mps-fallback: 'eror' is not a mode; did you mean --mps-fallback=error? "
        "choose from error, warn, off",
    ),
    (
        ["--mps-fallback", "eror"],
        "--mps-fallback: 'eror' is not a mode; did you mean --mps-fallback=error? "
        "choose from error, warn, off",
    ),
    (
        ["--mps-mixed-devices=wrn"],
        "--mps-mixed-devices: 'wrn' is not a mode; did you mean "
        "--mps-mixed-devices=warn? choose from error, warn, off",
    ),
    (
        ["--mps-benchmark-sort=medain"],
        "--mps-benchmark-sort: 'medain' is not a column to sort by; did you mean "
        "--mps-benchmark-sort=median? choose from name, fullname, min, max, mean, "
        "median, stddev, ops",
    ),
    (
        ["--mps-benchmark-name", "shrt"],
        "--mps-benchmark-name: 'shrt' is not a name format; did you mean "
        "--mps-benchmark-name=short? choose from short, normal, long",
    ),
    (
        ["--mps-benchmark-time-unit=sec"],
        "--mps-benchmark-time-unit: 'sec' is not a time unit; "
        "choose from auto, s, ms, us, ns",
    ),
    (
        ["--mps-benchmark-group-by=func,devce"],
        "--mps-benchmark-group-by: devce is not a grouping; did you mean 'device'? "
        "choose from group, name, fullname, func, fullfunc, param, device, "
        "param:NAME",
    ),
    (
        ["--mps-benchmark-columns=min,medain"],
        "--mps-benchmark-columns: medain is not a column; did you mean 'median'? "
        "choose from min, max, mean, stddev, median, iqr, outliers, ops, rounds, "
        "iterations, device, ratio, dispatch, verdict, events, memory",
    ),
    (
        ["--mps-device=mbs"],
        "--mps-device: 'mbs' is not a device; did you mean 'mps'? "
        "use cpu, mps, cuda, cuda:N or auto",
    ),
    (
        ["--mps-report="],
        "--mps-report: the path is empty; name a file, like report.json",
    ),
    (
        ["--mps-seed", "abc"],
        "--mps-seed: 'abc' is not a seed; use an integer or 'random'",
    ),
    (
        ["--mps-audit=eror"],
        "--mps-audit=eror: did you mean `--mps-audit=error`? the audit's levels "
        "are off, report, error, given as --mps-audit=LEVEL",
    ),
]


def _errors(result: pytest.RunResult) -> list[str]:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.stderr.lines if line.strip()]
    assert len(lines) <= 2, lines
    return lines


@pytest.mark.parametrize(
    ("args", "message"), COMMAND_LINE, ids=[" ".join(a) for a, _ in COMMAND_LINE]
)
def test_a_bad_value_says_what_was_meant_in_one_line(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile("def test_a(): pass")
    assert _errors(pytester.runpytest(*args)) == [f"ERROR: {message}"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "mps_fallback",
            "wran",
            "'wran' is not a mode; did you mean 'warn'? choose from error, warn, off",
        ),
        (
            "mps_benchmark_time_unit",
            "mss",
            "'mss' is not a time unit; did you mean 'ms'? "
            "choose from auto, s, ms, us, ns",
        ),
        (
            "mps_audit",
            "reprot",
            "'reprot' is not a level; did you mean 'report'? "
            "choose from off, report, error",
        ),
    ],
)
def test_a_bad_ini_value_names_the_file_and_the_closest_value(
    pytester: pytest.Pytester, name: str, value: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{name} = {value}\n")
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest("--mps-benchmark-only" if "bench" in name else "-q")
    ini = pytester.path / "tox.ini"
    assert _errors(result) == [f"ERROR: ini option {name} in {ini}: {message}"]


def test_a_good_value_in_any_case_is_taken(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(): pass")
    result = pytester.runpytest("--mps-fallback=WARN", "--mps-benchmark-sort=Min")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "key",
    [
        "mps_isolate",
        "mps_watch_every_op",
        "mps_audit_check",
        "mps_parity_fresh",
        "mps_benchmark_autosave",
        "mps_benchmark_alias",
    ],
)
def test_a_bad_boolean_ini_value_names_its_key_and_file(
    pytester: pytest.Pytester, key: str
) -> None:
    pytester.makeini(f"[pytest]\n{key} = maybe\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: ini option {key} in *tox.ini: invalid truth value 'maybe'; "
            "use true or false"
        ]
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "mps_allow_fallback",
            "bogus!",
            "'bogus!' is not an op name such as aten::_linalg_svd or "
            "aten::index.Tensor",
        ),
        (
            "mps_audit_ignore",
            "float64",
            "'float64' is not 'path: name, name  # reason'*",
        ),
    ],
)
def test_a_bad_list_ini_value_is_one_line_while_its_feature_is_off(
    pytester: pytest.Pytester, key: str, value: str, expected: str
) -> None:
    pytester.makeini(f"[pytest]\n{key} = {value}\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: ini option {key} in *tox.ini: {expected}"])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pytest.ini", "[pytest]\nmps_emualte = true\n"),
        ("tox.ini", "[pytest]\nmps_emualte = true\n"),
        ("pyproject.toml", "[tool.pytest.ini_options]\nmps_emualte = true\n"),
    ],
)
def test_a_typoed_ini_key_is_a_warning_naming_the_key_meant(
    pytester: pytest.Pytester, name: str, text: str
) -> None:
    # pytest's own warning names the key only, and the suite then ran on the CPU
    (pytester.path / name).write_text(text)
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, warnings=2)
    result.stdout.fnmatch_lines(
        [
            f"*PytestConfigWarning: pytest-mps: ini option mps_emualte in *{name} "
            "is not one of pytest-mps's, so it does nothing; did you mean "
            "mps_emulate?"
        ]
    )


def test_known_ini_keys_raise_no_warning(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_seed = 3\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*is not one of pytest-mps's*")


def test_another_plugins_mps_key_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_addoption(parser):\n    parser.addini('mps_colour', 'theirs')\n"
    )
    pytester.makeini("[pytest]\nmps_colour = red\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*is not one of pytest-mps's*")
