"""Every conversion entry point of docs/emulation.md's table, under --mps-emulate.

Each user test below is one row of the table ("Conversions"): what a Mac
gives for it, asserted on the emulated device. The rows the emulation does not
give yet are strict xfails, so the day one is fixed the table must say so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import copy, inspect, io, pickle
import numpy as np
import pytest
import torch
import torch.utils.dlpack as dl

D = "mps"
NUMPY = "can't convert mps:0 device type tensor to numpy"


def m(dtype=torch.float32):
    return torch.arange(4, dtype=dtype, device=D)


def kind(t):
    return t.device.type


def test_to_device():
    assert kind(m().to("cpu")) == "cpu" and kind(torch.ones(2).to(D)) == "mps"


def test_to_dtype():
    assert kind(m().to(torch.float16)) == "mps"


def test_to_other():
    r = torch.ones(2).to(m(torch.float16))
    assert kind(r) == "mps" and r.dtype == torch.float16


def test_to_copy():
    t = m()
    r = t.to(D, copy=True)
    assert kind(r) == "mps" and r.data_ptr() != t.data_ptr()


def test_to_same_is_self():
    t = m()
    assert t.to(D) is t and t.to("mps:0") is t


def test_nonblocking():
    assert kind(torch.ones(2).to(D, non_blocking=True)) == "mps"
    assert kind(m().to("cpu", non_blocking=True)) == "cpu"


def test_cpu():
    assert kind(m().cpu()) == "cpu"


def test_module_to():
    lin = torch.nn.Linear(2, 2).to(D)
    assert kind(lin.weight) == "mps" and kind(lin.cpu().weight) == "cpu"


def test_numpy_refused():
    with pytest.raises(TypeError, match=NUMPY):
        m().numpy()


def test_np_asarray_refused():
    with pytest.raises(TypeError, match=NUMPY):
        np.asarray(m())


def test_tolist_item():
    assert m().tolist() == [0.0, 1.0, 2.0, 3.0] and m()[1].item() == 1.0


def test_from_numpy():
    assert kind(torch.from_numpy(np.ones(2))) == "cpu"


def test_as_tensor_numpy_to_device():
    a = np.ones(2, dtype=np.float32)
    assert kind(torch.as_tensor(a, device=D)) == "mps"


def test_from_buffer_frombuffer():
    assert kind(torch.frombuffer(bytearray(8), dtype=torch.float32)) == "cpu"


def test_tensor_of_device_tensor():
    assert kind(torch.tensor(m())) == "mps"


def test_asarray_no_device():
    assert kind(torch.asarray(m())) == "mps"


def test_tensor_ctor_legacy():
    assert kind(torch.Tensor(m())) == "mps"


def test_like():
    assert kind(torch.zeros_like(m())) == "mps"
    assert kind(torch.zeros_like(m(), device="cpu")) == "cpu"


def test_empty_like_rand_like():
    assert kind(torch.empty_like(m())) == kind(torch.rand_like(m())) == "mps"


def test_new_full_empty_ones():
    t = m()
    made = (t.new_full((2,), 1.0), t.new_empty(2), t.new_ones(2))
    assert {kind(x) for x in made} == {"mps"}


def test_clone_detach_data():
    t = m()
    assert kind(t.clone()) == kind(t.detach()) == kind(t.data) == "mps"


def test_copy_into():
    c = torch.zeros(4)
    c.copy_(m())
    assert kind(c) == "cpu" and c[3] == 3
    t = m()
    t.copy_(torch.ones(4))
    assert kind(t) == "mps" and t[0] == 1


def test_type_strings():
    assert m().type() == "torch.mps.FloatTensor"
    assert kind(m().type("torch.FloatTensor")) == "cpu"
    assert kind(torch.ones(2).type("torch.mps.FloatTensor")) == "mps"


def test_type_classes():
    assert kind(m().type(torch.FloatTensor)) == "cpu"
    assert kind(m().type(torch.float16)) == "mps"
    assert m().type("torch.HalfTensor").dtype == torch.float16


def test_deepcopy():
    assert kind(copy.deepcopy(m())) == "mps"


def test_pickle():
    assert kind(pickle.loads(pickle.dumps(m()))) == "mps"


def test_save_load():
    b = io.BytesIO()
    torch.save(m(), b)
    b.seek(0)
    assert kind(torch.load(b)) == "mps"
    b.seek(0)
    assert kind(torch.load(b, map_location="cpu")) == "cpu"


def test_state_dict_load():
    state = torch.nn.Linear(2, 2).to(D).state_dict()
    other = torch.nn.Linear(2, 2)
    other.load_state_dict(state)
    assert kind(state["weight"]) == "mps" and kind(other.weight) == "cpu"


def test_is_mps_get_device():
    t = m()
    assert t.is_mps and not t.is_cpu and t.get_device() == 0


def test_str_device():
    assert str(m().device) == "mps:0" and "device='mps:0'" in repr(m())


def test_storage():
    t = m()
    assert t.untyped_storage().device.type == "mps"
    assert torch.ones(2).untyped_storage().device.type == "cpu"
    twin = copy.deepcopy(t)
    assert kind(twin) == "mps" and twin.untyped_storage().device.type == "mps"
    assert torch.equal(twin.cpu(), t.cpu())
    assert t.untyped_storage().cpu().device.type == "cpu"


#: torch 2.8 gave mps tensors a DLPack device (kDLMetal); before, a Mac raised
METAL = "mps" in inspect.getsource(torch.Tensor.__dlpack_device__)


def test_dlpack_device():
    if not METAL:
        with pytest.raises(ValueError, match="Unknown device type mps for Dlpack"):
            m().__dlpack_device__()
        return
    assert m().__dlpack_device__() == (8, 0)  # kDLMetal
    assert torch.ones(2).__dlpack_device__() == (1, 0)


def test_dlpack_roundtrip():
    t = m()
    if not METAL:
        with pytest.raises(ValueError, match="Unknown device type mps for Dlpack"):
            torch.from_dlpack(t)
        return
    for made in (dl.from_dlpack(dl.to_dlpack(t)), torch.from_dlpack(t),
                 torch.from_dlpack(t, device="mps")):
        assert kind(made) == "mps"
        made[0] = 7.0  # sharing memory
        assert t[0].item() == 7.0
        t[0] = 0.0
    host = torch.from_dlpack(t, device="cpu")
    assert kind(host) == "cpu"
    host[0] = 5.0  # a copy
    assert t[0].item() == 0.0
    assert kind(torch.from_dlpack(torch.ones(2))) == "cpu"
"""


#: The user tests the emulation does not pass yet (the table's "not yet" rows)
NOT_YET: tuple[str, ...] = ()


def test_every_conversion_of_the_table_behaves_as_on_a_mac(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("numpy")
    pytester.makepyfile(test_conversions=USER_TESTS)
    result = pytester.runpytest("--mps-emulate", "-p", "no:cacheprovider", "-rxX")
    names = re.findall(r"^def (test_\w+)", USER_TESTS, re.MULTILINE)
    result.assert_outcomes(passed=len(names) - len(NOT_YET), xfailed=len(NOT_YET))


def test_the_docs_table_names_every_conversion_test() -> None:
    table = (Path(__file__).parent.parent / "docs" / "emulation.md").read_text()
    names = re.findall(r"^def (test_\w+)", USER_TESTS, re.MULTILINE)
    for name in names:
        assert f"`{name}`" in table, name
    for name in names:
        row = next(line for line in table.splitlines() if f"`{name}`" in line)
        assert ("not yet" in row) == (name in NOT_YET), row
