"""A good citizen: installed, pytest-mps leaves a stranger's suite as it was.

Each project shape below is run twice, with the plugin active and with
``-p no:mps``, and must give the same test ids and outcomes; the namespaced
flags must still reach pytest-mps in the same project.
"""

from __future__ import annotations

import re
import sys

import pytest

pytest_plugins = ["pytester"]

_LINE = re.compile(
    r"^(?P<id>\S+::\S+) (?P<outcome>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b"
)


def outcomes(result: pytest.RunResult) -> list[tuple[str, str]]:
    """The (test id, outcome) pairs of a ``-v`` run, in order."""
    found = []
    for line in result.outlines:
        match = _LINE.match(line)
        if match:
            found.append((match["id"], match["outcome"]))
    return found


def same_with_and_without(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run twice; assert identical ids, outcomes and exit codes; return the first."""
    with_plugin = pytester.runpytest("-v", "-p", "no:cacheprovider", *args)
    without = pytester.runpytest("-v", "-p", "no:cacheprovider", "-p", "no:mps", *args)
    assert outcomes(with_plugin) == outcomes(without), (
        with_plugin.stdout.str(),
        without.stdout.str(),
    )
    assert outcomes(with_plugin), with_plugin.stdout.str()
    assert with_plugin.ret == without.ret
    return with_plugin


OWN_DEVICE_OPTION = """
    import pytest

    def pytest_addoption(parser):
        parser.addoption("--device", default="cpu", help="torch device to run on")

    @pytest.fixture
    def device(request):
        return request.config.getoption("--device")
"""


def test_a_project_device_option_wins_and_mps_device_still_reaches_us(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(OWN_DEVICE_OPTION)
    pytester.makepyfile(
        """
        def test_runs_on(device):
            assert device == "meta"
        """
    )
    result = same_with_and_without(pytester, "--device", "meta")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*yielded to the project's own --device*"])
    # the namespaced spelling is still pytest-mps's: MPS is refused on Linux
    ours = pytester.runpytest("--mps-device=mps")
    assert ours.ret == pytest.ExitCode.USAGE_ERROR
    ours.stderr.fnmatch_lines(["*--mps-device mps: MPS cannot be used*"])


def test_a_project_device_option_wins_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(OWN_DEVICE_OPTION)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        def test_runs_on(device, n):
            assert device == "meta"
        """
    )
    result = pytester.runpytest("-n", "2", "--device=meta")
    result.assert_outcomes(passed=2)


def test_a_project_mps_flag_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        def pytest_addoption(parser):
            parser.addoption("--mps", action="store_true", help="our own MPS switch")

        @pytest.fixture
        def wants_mps(request):
            return request.config.getoption("--mps")
        """
    )
    pytester.makepyfile(
        """
        def test_flag(wants_mps):
            assert wants_mps is True
        """
    )
    result = same_with_and_without(pytester, "--mps")
    result.assert_outcomes(passed=1)
    ours = pytester.runpytest("--mps-device=mps")
    assert ours.ret == pytest.ExitCode.USAGE_ERROR


def test_a_project_seed_option_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        def pytest_addoption(parser):
            parser.addoption("--seed", type=int, default=0)

        @pytest.fixture
        def seed(request):
            return request.config.getoption("--seed")
        """
    )
    pytester.makepyfile("def test_seed(seed):\n    assert seed == 7\n")
    same_with_and_without(pytester, "--seed", "7").assert_outcomes(passed=1)


def test_parametrizing_device_with_a_mark_stands(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("device", ["cpu", "meta"])
        def test_both(device):
            assert device in ("cpu", "meta")
        """
    )
    result = same_with_and_without(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_both[[]meta[]] PASSED*"])


def test_a_project_parametrized_device_fixture_stands(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture(params=["cpu", "meta"])
        def device(request):
            return request.param
        """
    )
    pytester.makepyfile("def test_both(device):\n    assert device\n")
    same_with_and_without(pytester).assert_outcomes(passed=2)


def test_a_project_generate_tests_on_device_stands(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        def pytest_generate_tests(metafunc):
            if "device" in metafunc.fixturenames:
                metafunc.parametrize("device", ["cpu", "meta"])
        """
    )
    pytester.makepyfile("def test_both(device):\n    assert device\n")
    same_with_and_without(pytester).assert_outcomes(passed=2)


def test_project_generate_tests_parametrizing_our_device_indirectly_stands(
    pytester: pytest.Pytester,
) -> None:
    # no fixture of its own: its indirect parametrization feeds ours
    pytester.makeconftest(
        """
        def pytest_generate_tests(metafunc):
            if "device" in metafunc.fixturenames:
                metafunc.parametrize("device", ["meta"], indirect=True)
        """
    )
    pytester.makepyfile("def test_one(device):\n    assert device.type == 'meta'\n")
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_one[[]meta[]] PASSED*"])


def test_an_indirect_device_mark_on_our_fixture_stands(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("device", ["meta"], indirect=True)
        def test_one(device):
            assert device.type == "meta"
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_one[[]meta[]] PASSED*"])


def test_plain_project_fixtures_keep_their_test_ids(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def device():
            return "cpu"

        @pytest.fixture
        def seed():
            return 1

        @pytest.fixture
        def mps_device():
            return "not ours"
        """
    )
    pytester.makepyfile(
        """
        def test_uses_own(device, seed, mps_device):
            assert (device, seed, mps_device) == ("cpu", 1, "not ours")
        """
    )
    result = same_with_and_without(pytester)
    result.stdout.fnmatch_lines(["*::test_uses_own PASSED*"])


def test_a_class_scoped_device_fixture_keeps_its_ids(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        class TestModel:
            @pytest.fixture(scope="class")
            def device(self):
                return "cpu"

            def test_a(self, device):
                assert device == "cpu"

            def test_b(self, device):
                assert device == "cpu"

        def test_outside():
            pass
        """
    )
    same_with_and_without(pytester).assert_outcomes(passed=3)


def test_a_module_device_fixture_keeps_its_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def device():
            return "meta"

        def test_a(device):
            assert device == "meta"
        """
    )
    same_with_and_without(pytester).assert_outcomes(passed=1)


def test_a_project_mps_marker_is_not_acted_on(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        markers =
            mps: tests about our MPS bookkeeping
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps
        def test_mine():
            pass
        """
    )
    result = same_with_and_without(pytester, "--strict-markers")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*yielded to the project's own marker mps*"])


def test_a_project_marker_added_in_conftest_is_not_acted_on(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        def pytest_configure(config):
            config.addinivalue_line("markers", "no_host_sync: ours, not a plugin's")
        """
    )
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.no_host_sync
        def test_reads_back():
            assert torch.ones(2).sum().item() == 2.0
        """
    )
    same_with_and_without(pytester, "--strict-markers").assert_outcomes(passed=1)


def test_our_markers_still_work_where_not_declared(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps
        def test_needs_mps():
            raise AssertionError("must not run off MPS")
        """
    )
    pytester.runpytest("--strict-markers").assert_outcomes(skipped=1)


def test_the_environment_is_left_alone_without_opting_in(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    pytester.makepyfile(
        """
        import os, torch

        def test_env():
            assert "PYTORCH_ENABLE_MPS_FALLBACK" not in os.environ
            assert not torch.is_warn_always_enabled()
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_mps_opts_in_to_setting_the_fallback_variable(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    pytester.makepyfile(
        """
        import os

        def test_env():
            assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"
        """
    )
    pytester.runpytest_subprocess("--mps-fallback=warn").assert_outcomes(passed=1)


def test_a_suite_without_torch_gets_no_header_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*pytest-mps*")


def test_a_suite_importing_torch_gets_one_header_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("import torch\n")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    header = [line for line in result.outlines if "pytest-mps" in line]
    assert len(header) == 1, header
    assert header[0].startswith("pytest-mps: torch ")


def test_a_missing_mps_kernel_gets_one_line_naming_the_ways_out(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        def test_op():
            raise NotImplementedError(
                "The operator 'aten::_linalg_eigh' is not currently implemented "
                "for the MPS device. If you want this op to be considered ..."
            )
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*pytest-mps fallback*",
            "aten::_linalg_eigh has no MPS kernel: run with --mps-fallback=warn, "
            "or set PYTORCH_ENABLE_MPS_FALLBACK=1, *",
        ]
    )


def test_our_own_device_fixture_still_runs_once_per_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_model(device):\n    assert device.type == 'cpu'\n")
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_model[[]cpu[]] PASSED*"])


def _expected_parser_kind() -> str:
    major, minor = (int(part) for part in pytest.__version__.split(".")[:2])
    if major < 9:
        return "built-at-parse"
    return "argparse-early" if (major, minor) == (9, 0) else "argparse-actions"


def test_the_private_pytest_parser_api_we_read_is_still_there(
    pytester: pytest.Pytester,
) -> None:
    """Fails loudly when pytest moves what the flag yielding reads."""
    from pytest_mps import flags

    config = pytester.parseconfig()
    parser = config._parser
    assert flags.parser_kind(parser) == _expected_parser_kind(), pytest.__version__
    taken_out = flags._detach_short_flags(parser)
    if flags.parser_kind(parser) == "built-at-parse":
        # pytest 8 builds argparse at each parse: a flag another option names
        # is dropped from ours instead, and an option left with no name goes
        assert taken_out == []
        parser.addoption("--mps", action="store_true", help="the project's own")
        assert flags._yield_pytest8(parser) == ["--mps"]
        ours = parser.getgroup(flags.GROUP).options
        assert [a.dest for a in ours if "--mps" in a.names()] == []
        assert "mps_only" not in [a.dest for a in ours]
        return
    assert sorted(flag for _, _, flag in taken_out) == ["--device", "--mps"]
    assert "--device" not in parser.optparser._option_string_actions
    assert flags._reattach_short_flags(parser, taken_out) == []
    actions = parser.optparser._option_string_actions
    assert actions["--device"] is actions["--mps-device"]
    assert "--mps" in actions


def test_a_parser_layout_we_do_not_know_keeps_only_the_prefixed_flags(
    pytester: pytest.Pytester,
) -> None:
    """The public fallback: an unknown parser gets --mps-device, never --device."""
    from pytest_mps import flags

    class Stranger:  # a parser with none of the private parts we read
        pass

    assert flags.parser_kind(Stranger()) is None  # type: ignore[arg-type]
    assert not flags.short_flags_allowed(Stranger())  # type: ignore[arg-type]


def test_the_ini_names_list_is_complete(pytester: pytest.Pytester) -> None:
    from pytest_mps import ownership

    result = pytester.runpytest("--help")
    listed = set(re.findall(r"^\s+(mps_\w+) \(", result.stdout.str(), re.MULTILINE))
    assert listed == set(ownership.INI_NAMES)


def test_disabling_the_plugin_leaves_no_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:mps", "--mps-device=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --mps-device=cpu*"])


HOOKS_SEEN = """
def pytest_sessionfinish(session):
    manager = session.config.pluginmanager
    print("benchmark hooks:", manager.has_plugin("pytest_mps.benchmark.hooks"))
"""


@pytest.mark.parametrize(
    ("test_file", "args", "registered"),
    [
        ("def test_one():\n    pass\n", [], False),
        ("def test_one():\n    pass\n", ["--mps-benchmark-max-time=0.5"], True),
        ("def test_one(mps_benchmark):\n    mps_benchmark(sum, [1])\n", [], True),
        (
            "import pytest\n\n@pytest.fixture\ndef mps_benchmark():\n    return 1\n\n"
            "def test_one(mps_benchmark):\n    assert mps_benchmark == 1\n",
            [],
            False,
        ),
    ],
    ids=["plain", "option", "our fixture", "the project's fixture"],
)
def test_family_hooks_register_only_when_asked(
    pytester: pytest.Pytester, test_file: str, args: list[str], registered: bool
) -> None:
    """A run pays for a family's hooks only once it or a test asks for them."""
    pytester.makeconftest(HOOKS_SEEN)
    pytester.makepyfile(test_file)
    result = pytester.runpytest_subprocess("-s", "-rs", "-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*benchmark hooks: {registered}"])


SURFACE_SEEN = """
import pytest

def pytest_sessionfinish(session):
    names = dir(session.config.pluginmanager.get_plugin("pytest_mps.startup"))
    print("surface:", "pytest" in names, "devices" in names, "device" in names,
          "pytest_configure" in names, "mps_memory" in names)
"""


def test_pytest_scans_only_what_our_modules_define(pytester: pytest.Pytester) -> None:
    """pluggy and pytest scan the start-up module's hooks and fixtures only."""
    pytester.makeconftest(SURFACE_SEEN)
    pytester.makepyfile("def test_uses(device):\n    assert device.type == 'cpu'\n")
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # imports (pytest, the devices module) are gone; the fixtures and the hooks
    # stay, the fixtures imported from the families too
    result.stdout.fnmatch_lines(["*surface: False False True True True"])


LOADERS_SEEN = """
import sys

def test_loaders():
    import pytest_mps.assertions
    import pytest_mps.watch.memory  # an engine, imported once a test asks

    def loader(name):
        return type(sys.modules[name].__loader__).__name__

    print("loaders:", loader("pytest_mps.devices"), loader("pytest_mps.watch.plugin"),
          loader("pytest_mps.watch.memory"), loader("pytest_mps.assertions"))
"""


def test_start_up_modules_skip_the_rewrite_hook_that_user_facing_ones_keep(
    pytester: pytest.Pytester,
) -> None:
    """Installed from a wheel, the package is marked for rewriting as a plugin's.

    pytest marks every module of a ``pytest11`` distribution for assertion
    rewriting; ``-p mark_all`` does the same here, where the editable install
    lists no module files. The start-up modules still load from their files;
    the assertion helpers stay rewritten. The finder leaves with the session.
    """
    pytester.makepyfile(
        mark_all="import pytest\npytest.register_assert_rewrite('pytest_mps')\n"
    )
    pytester.makepyfile(test_loaders=LOADERS_SEEN)
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", "-p", "mark_all"
    )
    result.assert_outcomes(passed=1)
    from_files = "SourceFileLoader SourceFileLoader SourceFileLoader"
    result.stdout.fnmatch_lines([f"*loaders: {from_files} AssertionRewritingHook"])
    before = list(sys.meta_path)  # this session's finder among them
    inline = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    inline.assert_outcomes(passed=1)
    assert sys.meta_path == before
