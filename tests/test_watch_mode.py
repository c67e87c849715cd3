"""The shared op-watching mode and the --mps-report JSON file."""

from __future__ import annotations

import json

import pytest

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails (the watch mode imports it on
# torch versions without the C-level Dynamo skip, see pytest_mps/watch.py).
import torch._dynamo  # noqa: E402, F401

CONFTEST_WATCHER = """
import pytest
import torch

seen = []

def pytest_mps_watch_ops(item):
    if item.get_closest_marker("watched") is None:
        return None
    return lambda func, args, kwargs: seen.append(func._schema.name)

def pytest_configure(config):
    config.addinivalue_line("markers", "watched: watch ops")

@pytest.fixture
def seen_ops():
    seen.clear()
    return seen
"""


def test_a_hook_callback_sees_every_aten_op_of_a_watched_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST_WATCHER)
    pytester.makepyfile(
        """
        import pytest
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        @pytest.mark.watched
        def test_watched(seen_ops):
            x = torch.ones(3)
            (x * 2).sum()
            assert seen_ops == ["aten::ones", "aten::mul", "aten::sum"]

        def test_unwatched_test_runs_without_a_mode(seen_ops):
            torch.ones(3) * 2
            assert seen_ops == []
            assert _get_current_dispatch_mode_stack() == []
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_composite_ops_under_inference_mode_are_seen_as_their_parts(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST_WATCHER)
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.watched
        def test_item_in_inference_mode(seen_ops):
            x = torch.ones(3)
            with torch.inference_mode():
                x.sum().item()
                torch.nn.functional.linear(x, torch.ones(2, 3))
            assert "aten::_local_scalar_dense" in seen_ops
            assert "aten::item" not in seen_ops
            assert "aten::linear" not in seen_ops
            assert "aten::addmm" in seen_ops or "aten::mm" in seen_ops
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_op_watch_joins_the_running_mode_instead_of_stacking_another(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST_WATCHER)
    pytester.makepyfile(
        """
        import pytest
        import torch
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        from pytest_mps.watch.mode import op_watch

        @pytest.mark.watched
        def test_joined(seen_ops):
            mine = []
            with op_watch(lambda f, a, k: mine.append(f._schema.name)):
                assert len(_get_current_dispatch_mode_stack()) == 1
                torch.zeros(2).neg()
            torch.zeros(1)
            assert mine == ["aten::zeros", "aten::neg"]
            assert seen_ops == ["aten::zeros", "aten::neg", "aten::zeros"]

        def test_alone():
            mine = []
            with op_watch(lambda f, a, k: mine.append(f._schema.name)):
                torch.zeros(2)
            assert mine == ["aten::zeros"]
            assert _get_current_dispatch_mode_stack() == []
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_user_location_names_the_test_line_not_torch_internals(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import sys
        import torch
        from pytest_mps.watch.mode import op_watch
        from pytest_mps.watch.locations import user_location

        def test_location():
            where = []
            def callback(func, args, kwargs):
                # start above this callback, as pytest-mps's own callbacks do
                where.append(user_location(sys._getframe(1)))
            layer = torch.nn.Linear(3, 2)
            with op_watch(callback):
                layer(torch.ones(3))
            assert where
            assert all(w.endswith("_internals.py:13") for w in where), where
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_mps_report_writes_sections_as_json(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        from pytest_mps.report import add_report_section

        def pytest_sessionfinish(session):
            add_report_section(session.config, "example", {"ops": ["aten::x"]})
        """
    )
    pytester.makepyfile("def test_nothing_on_device(): assert True")
    result = pytester.runpytest("--mps-report", "out/report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["pytest-mps: writing the report to *report.json"])
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert data["example"] == {"ops": ["aten::x"]}
    assert data["pytest_mps"]["devices"] == ["cpu"]
    assert [p.name for p in (pytester.path / "out").iterdir()] == ["report.json"]


def test_mps_report_has_an_ini_twin(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_report = r.json\n")
    pytester.makepyfile("def test_nothing_on_device(): assert True")
    pytester.runpytest().assert_outcomes(passed=1)
    assert json.loads((pytester.path / "r.json").read_text())["pytest_mps"]
