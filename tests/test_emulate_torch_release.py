"""The emulated device follows the installed torch: 2.15's float8 and streams.

torch 2.15 (what ``pip install torch`` gives a Mac today) holds float8_e4m3fn
on MPS and has a stream API; before 2.15 a Mac refuses float8 and has no
``torch.mps.Stream``. Each test runs a user's file under ``--mps-emulate`` and
checks the outcome the installed torch's Mac would give.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mps.ops import yaml_rules

pytest_plugins = ["pytester"]

ON_215 = yaml_rules.torch_version() >= (2, 15)

FLOAT8 = """
import torch

def test_float8_moves_to_the_device_and_gathers():
    x = torch.arange(12.0).reshape(4, 3).to(torch.float8_e4m3fn)
    on_device = x.to("mps")
    assert on_device.device.type == "mps"
    assert on_device.dtype == torch.float8_e4m3fn
    index = torch.tensor([[0, 1, 2], [3, 2, 1]], device="mps")
    gathered = torch.gather(on_device, 0, index)
    assert gathered.device.type == "mps"
    assert gathered.dtype == torch.float8_e4m3fn
    assert gathered.float().tolist() == [[0.0, 4.0, 8.0], [9.0, 7.0, 5.0]]
    out = torch.zeros(4, 3, device="mps", dtype=torch.float8_e4m3fn)
    out.scatter_(0, index, gathered)
    assert out.device.type == "mps" and out.dtype == torch.float8_e4m3fn
    assert out.float()[3].tolist() == [9.0, 0.0, 0.0]

def test_float8_ops_a_mac_refuses_stay_refused():
    x = torch.ones(3, device="mps", dtype=torch.float8_e4m3fn)
    try:
        x + x
    except NotImplementedError as exc:
        assert "Float8_e4m3fn" in str(exc)
    else:
        raise AssertionError("float8 add ran")
"""


STREAMS = """
import pytest
import torch

def test_streams_are_made_set_and_synchronized():
    default = torch.mps.default_stream()
    assert default.stream_id == 0
    assert torch.mps.current_stream() == default
    side = torch.mps.Stream()
    assert side != default and side.stream_id != 0
    with torch.mps.stream(side):
        assert torch.mps.current_stream() == side
        y = torch.ones(3, device="mps") * 2
        side.synchronize()
    assert torch.mps.current_stream() == default
    torch.mps.set_stream(side)
    assert torch.mps.current_stream() == side
    torch.mps.set_stream(default)
    torch.mps.synchronize()
    assert y.device.type == "mps"
    assert repr(side) == f"<torch.mps.Stream stream_id={side.stream_id}>"

def test_an_event_on_a_non_default_stream_is_refused():
    event = torch.mps.Event()
    event.record()
    event.wait()
    side = torch.mps.Stream()
    with torch.mps.stream(side):
        with pytest.raises(NotImplementedError) as record:
            event.record()
        assert str(record.value) == "Non-default streams are not yet supported."
        with pytest.raises(NotImplementedError):
            event.wait()
"""


@pytest.mark.parametrize(
    "source, before_215",
    [
        # a Mac before 2.15: getMPSDataType has no case for float8
        pytest.param(
            FLOAT8,
            "*TypeError: Trying to convert Float8_e4m3fn to the MPS backend but "
            "it does not have support for that dtype.*",
            id="float8",
        ),
        pytest.param(
            STREAMS,
            "*AttributeError: module 'torch.mps' has no attribute 'Stream'*",
            id="streams",
        ),
    ],
)
def test_the_device_follows_the_installed_torch(
    pytester: pytest.Pytester, source: str, before_215: str
) -> None:
    pytester.makepyfile(source)
    result = pytester.runpytest_subprocess("--mps-emulate", "-p", "no:cacheprovider")
    if ON_215:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(failed=2)
        result.stdout.fnmatch_lines([before_215])


def test_the_stream_emulation_is_undone_after_the_session(
    pytester: pytest.Pytester,
) -> None:
    if not ON_215:
        assert not hasattr(torch.mps, "Stream")
        assert not hasattr(torch._C, "_mps_getCurrentStream")
        return
    pytester.makepyfile(
        """
        import torch

        def test_moves_to_a_side_stream():
            torch.mps.set_stream(torch.mps.Stream())

        def test_the_current_stream_is_the_process_s_as_on_a_mac():
            # torch.mps.set_stream sets the process's stream: a later test sees it
            assert torch.mps.current_stream().stream_id != 0
            torch.mps.set_stream(torch.mps.default_stream())
        """
    )
    # in this process: what the emulation patched must be back afterwards
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    base = torch._C._MPSStreamBase  # type: ignore[attr-defined]
    assert "stream_id" not in vars(base)
    with pytest.raises(RuntimeError, match="dummy base class"):
        base()
