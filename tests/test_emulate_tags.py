"""The tagged design of the emulated device, the default of ``--mps-emulate``.

Device tensors are CPU tensors whose storage is tagged (emulate/tags.py), run
through one function mode (emulate/tagged.py) and per-op kernels at
BackendSelect (emulate/op_rules.py). These tests install it in this process
with real tensors and modules, and check what a Mac does: the device's
answers, the classic bugs with PyTorch's messages, and correct code running
with the CPU's numbers.
"""

from __future__ import annotations

import io
import threading

import pytest
import torch

from pytest_mps.emulate import op_rules, tags
from pytest_mps.emulate.install import Emulation

TWO_DEVICES = (
    "Expected all tensors to be on the same device, but found at least two "
    "devices, {} and {}!"
)
FLOAT64 = "Cannot convert a MPS Tensor to float64 dtype"
MPS = torch.device("mps", 0)


def run_emulated(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *options: str
) -> pytest.RunResult:
    """The suite under ``--mps-emulate``, in a subprocess."""
    return pytester.runpytest_subprocess(
        "--mps-emulate", *options, "-p", "no:cacheprovider"
    )


def test_a_device_tensor_answers_as_an_mps_tensor(emulated: Emulation) -> None:
    x = torch.ones(2, 3, device="mps")
    assert x.device == MPS and x.is_mps and not x.is_cpu and not x.is_cuda
    assert x.get_device() == 0 and x.type() == "torch.mps.FloatTensor"
    assert "device='mps:0'" in repr(x)
    # views, .data, detach and Parameter share the storage, and so the tag
    assert x[0].device == MPS and x.data.device == MPS and x.detach().device == MPS
    assert torch.nn.Parameter(x).device == MPS
    assert "Parameter containing" in repr(torch.nn.Parameter(x))
    assert (x * 2 + x).device == MPS
    assert torch.zeros_like(x).device == MPS
    assert torch.zeros_like(x, device="cpu").device.type == "cpu"


def test_moves_copy_between_the_device_and_the_host(emulated: Emulation) -> None:
    host = torch.arange(6.0).reshape(2, 3)
    on_device = host.to("mps")
    assert on_device.device == MPS and host.device.type == "cpu"
    assert on_device.untyped_storage().data_ptr() != host.untyped_storage().data_ptr()
    for back in (on_device.cpu(), on_device.to("cpu"), on_device.to(host)):
        assert back.device.type == "cpu"
        assert (
            back.untyped_storage().data_ptr() != on_device.untyped_storage().data_ptr()
        )
        assert back.tolist() == host.tolist()
    assert on_device.to("mps") is on_device
    assert on_device.to(torch.float16).device == MPS
    assert host.to(on_device).device == MPS
    assert on_device.to("meta").device.type == "meta"
    # gradients cross back in autograd's graph
    leaf = torch.ones(3, requires_grad=True)
    (leaf.to("mps") * 2).sum().backward()
    assert leaf.grad is not None and leaf.grad.device.type == "cpu"
    assert leaf.grad.tolist() == [2.0, 2.0, 2.0]


def test_host_tensors_beside_device_ones_fail_with_pytorchs_texts(
    emulated: Emulation,
) -> None:
    x = torch.ones(2, 3, device="mps")
    host = torch.ones(2, 3)
    with pytest.raises(RuntimeError) as found:
        x + host
    assert str(found.value) == TWO_DEVICES.format("mps:0", "cpu")
    with pytest.raises(RuntimeError) as found:
        host.add_(x)  # the written tensor comes first in a TensorIterator
    assert str(found.value) == TWO_DEVICES.format("cpu", "mps:0")
    with pytest.raises(RuntimeError, match=r"argument #2 'mat2' is on CPU.*for mm\)"):
        x @ host.t()
    with pytest.raises(
        RuntimeError, match="argument weight is on cpu but expected on mps"
    ):
        torch.nn.Linear(3, 4)(x)
    # what a Mac accepts: a 0-dim host tensor, host indices, copies
    assert (x * torch.tensor(2.0)).device == MPS
    assert x[torch.tensor([0, 1])].device == MPS
    x.index_put_((torch.tensor([0]),), torch.tensor(5.0))
    x.copy_(host)
    assert x.device == MPS and x.sum().item() == 6.0


def test_a_host_scalar_where_metal_binds_a_buffer_fails(emulated: Emulation) -> None:
    weight = torch.zeros(3, device="mps")
    with pytest.raises(
        RuntimeError, match=r"aten::lerp_\.Tensor binds its tensor inputs"
    ):
        weight.lerp_(torch.ones(3, device="mps"), torch.tensor(0.5))
    weight.lerp_(torch.ones(3, device="mps"), 0.5)
    assert weight.tolist() == [0.5, 0.5, 0.5]


def test_float64_fails_in_each_shape(emulated: Emulation) -> None:
    x = torch.ones(2, device="mps")
    for make in (
        lambda: torch.zeros(2, device="mps", dtype=torch.float64),
        lambda: torch.tensor([1.0], dtype=torch.float64, device="mps"),
        lambda: x.double(),
        lambda: x.to(torch.float64),
        lambda: torch.ones(2, dtype=torch.float64).to("mps"),
    ):
        with pytest.raises(TypeError, match=FLOAT64):
            make()


def test_host_reads_generators_and_grads_fail_as_on_a_mac(emulated: Emulation) -> None:
    x = torch.ones(2, device="mps")
    with pytest.raises(
        TypeError, match="can't convert mps:0 device type tensor to numpy"
    ):
        x.numpy()
    assert x.numpy(force=True).sum() == 2.0
    with pytest.raises(
        RuntimeError, match="Expected a 'mps' device type for generator but found 'cpu'"
    ):
        torch.randn(3, device="mps", generator=torch.Generator())
    assert torch.randn(3, device="mps", generator=torch.Generator("mps")).device == MPS
    param = torch.nn.Parameter(torch.ones(2, device="mps"))
    with pytest.raises(
        RuntimeError,
        match="gradient with device type 'cpu' to a tensor with device type 'mps'",
    ):
        param.grad = torch.zeros(2)


def test_an_op_without_an_mps_kernel_raises_only_on_the_device(
    emulated: Emulation,
) -> None:
    host = torch.randn(1, 2, 4, 4, 4)
    assert torch.nn.functional.adaptive_max_pool3d(host, 2).shape == (1, 2, 2, 2, 2)
    with pytest.raises(
        NotImplementedError,
        match="'aten::adaptive_max_pool3d' is not currently implemented for the MPS",
    ):
        torch.nn.functional.adaptive_max_pool3d(host.to("mps"), 2)
    assert not op_rules.active()


def test_a_module_moved_to_the_device_keeps_its_parameters(
    emulated: Emulation,
) -> None:
    # as on a Mac (dense tensors of any two devices are shallow-copy
    # compatible): an optimizer made before the move still holds the model's
    model = torch.nn.Linear(2, 2)
    before = model.weight
    model.to("mps")
    assert model.weight is before and before.device == MPS
    model.to("cpu")
    assert model.weight is before and before.device.type == "cpu"


def test_a_training_step_equals_the_cpus_bit_for_bit(emulated: Emulation) -> None:
    def step(device: str) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)
        ).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        batch = torch.randn(5, 8).to(device)
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
        weight = model[0].weight
        assert weight.device.type == device and weight.grad is not None
        assert weight.grad.device.type == device
        return loss.detach().cpu(), weight.detach().cpu()

    on_device = step("mps")
    on_host = step("cpu")
    torch.testing.assert_close(on_device, on_host, rtol=0, atol=0)


def test_code_a_tensor_subclass_broke_runs_as_on_a_mac(emulated: Emulation) -> None:
    a = torch.tensor([1 + 2j], device="mps")
    assert (a * torch.conj(a)).cpu().tolist() == [(5 + 0j)]
    y = torch.zeros(3, device="mps")
    y.unsqueeze_(0)
    assert y.shape == (1, 3) and y.device == MPS
    assert torch.ones(2, device="mps").untyped_storage().data_ptr() != 0
    one = torch.ones((), device="mps")
    made = torch.tensor((torch.cos(one), torch.sin(one), 0.0), device="mps")
    assert made.device == MPS and made.shape == (3,)
    base = torch.ones(2, device="mps")
    with torch.inference_mode():
        assert base[0].device == MPS
    assert (
        torch.nn.LazyLinear(4).to("mps")(torch.ones(2, 3, device="mps")).device == MPS
    )
    with torch.device("meta"):
        model = torch.nn.Linear(3, 4)
    assert model.to_empty(device="mps").weight.device == MPS


def test_save_and_load_keep_the_device(emulated: Emulation) -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.full((2,), 3.0, device="mps")}, buffer)
    buffer.seek(0)
    assert torch.load(buffer)["w"].device == MPS
    buffer.seek(0)
    assert torch.load(buffer, map_location="cpu")["w"].device.type == "cpu"


def test_threads_and_the_default_device_see_the_device(emulated: Emulation) -> None:
    made: list[torch.device] = []
    worker = threading.Thread(
        target=lambda: made.append(torch.ones(1, device="mps").device)
    )
    worker.start()
    worker.join()
    assert made == [MPS]
    torch.set_default_device("mps")
    try:
        assert torch.zeros(2).device == MPS
    finally:
        torch.set_default_device(None)


def test_undo_leaves_torch_as_it_was() -> None:
    before = (torch.backends.mps.is_available(), torch.device, torch.Generator)
    for _ in range(5):
        emulation = Emulation((99, 0), fallback=False)
        emulation.install()
        kept = torch.ones(2, device="mps")
        emulation.undo()
    after = (torch.backends.mps.is_available(), torch.device, torch.Generator)
    assert before == after
    assert kept.device.type == "cpu"  # the tag means nothing without the mode
    assert torch.nn.functional.adaptive_max_pool3d(torch.ones(1, 1, 2, 2, 2), 1).shape
    assert tags.tagged(kept)


def test_device_tensors_are_plain_tensors(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_one="""
        import torch

        def test_mixed(device):
            x = torch.ones(2, device=device)
            assert x.device.type == "mps"
            assert type(x) is torch.Tensor  # a tagged CPU tensor, no wrapper
            x + torch.ones(2)
        """
    )
    # the retired design's variable selects nothing any more
    monkeypatch.setenv("PYTEST_MPS_EMULATE_DESIGN", "wrapper")
    result = run_emulated(pytester, monkeypatch)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["E*RuntimeError: " + TWO_DEVICES.format("mps:0", "cpu")]
    )


def test_torchscript_outputs_follow_their_inputs_onto_the_device(
    emulated: Emulation,
) -> None:
    def scale(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2, device=x.device) + 2 * x

    scripted = torch.jit.script(scale)
    out = scripted(torch.ones(2, device="mps"))
    assert out.device == MPS and out.cpu().tolist() == [2.0, 2.0]
    assert scripted(torch.ones(2)).device.type == "cpu"
    module = torch.jit.script(torch.nn.Linear(2, 2).to("mps"))
    assert module(torch.ones(1, 2, device="mps")).device == MPS


def test_the_watchers_see_tagged_tensors_on_the_device(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_reads="""
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_tolist(device):
            torch.ones(2, device=device).tolist()

        @pytest.mark.no_host_sync
        def test_host_only(device):
            torch.ones(2).tolist()
        """
    )
    result = run_emulated(pytester, monkeypatch)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*HostSyncError: Tensor.tolist makes the host wait*"])


def test_the_mixed_device_guard_fails_only_what_a_mac_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_mix="""
        import torch
        import torch.nn.functional as F

        def test_a_host_scalar(device):
            x = torch.ones(3, device=device)
            assert (x * torch.tensor(2.0)).sum().item() == 6.0

        def test_tensors_made_inside_a_call(device):
            # the math path of attention makes tensors from q's options: on a
            # Mac they are on the device, here they are CPU tensors untagged
            q = torch.randn(1, 2, 4, 8, device=device)
            mask = torch.ones(4, 4, dtype=torch.bool, device=device).tril()
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            assert out.device.type == "mps"
            assert F.one_hot(torch.tensor([0, 2], device=device), 3).sum().item() == 2

        def test_a_host_tensor(device):
            torch.ones(2, device=device) + torch.ones(2)
        """
    )
    result = run_emulated(pytester, monkeypatch, "--mps-mixed-devices=error")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["FAILED test_mix.py::test_a_host_tensor*"])


def test_the_guard_takes_its_scalar_notes_from_the_emulation(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the emulation judges placements per call, so the guard watches no aten
    # op (no watch front, no dispatch mode), and its notes still name the op
    # and the user's line, calls outside the watch front's table included
    pytester.makepyfile(
        test_notes="""
        import torch
        from torch.overrides import _get_current_function_mode_stack

        def test_scalars(device):
            modes = [type(m).__name__ for m in _get_current_function_mode_stack()]
            assert modes == ["TagMode"]
            x = torch.ones(3, device=device)
            y = torch.where(x > 0, x, torch.tensor(0.0))
            x.fill_(torch.tensor(3.0))
            torch.testing.assert_close(y, torch.ones(3, device=device))
            assert (x * torch.tensor(2.0)).tolist() == [6.0] * 3
        """
    )
    result = run_emulated(pytester, monkeypatch)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "0-dim CPU tensors read as scalars by device ops*",
            "  aten::mul: 1 call(s) in 1 test(s)",
            "    test_notes.py::test_scalars[[]mps[]] x1 (first at test_notes.py:11)",
            "  aten::where: 1 call(s) in 1 test(s)",
            "    test_notes.py::test_scalars[[]mps[]] x1 (first at test_notes.py:8)",
        ]
    )
    result.stdout.no_fnmatch_line("*aten::fill*")
    off = run_emulated(pytester, monkeypatch, "--mps-mixed-devices=off")
    off.assert_outcomes(passed=1)
    off.stdout.no_fnmatch_line("*read as scalars*")


def test_dynamo_explain_counts_the_users_graphs_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dynamo traces every function mode on the stack; the emulation's reads
    # storages, which Dynamo cannot trace, and a Mac has no such breaks
    # (torch_geometric's test_compile_graph_breaks)
    pytester.makepyfile(
        test_explain="""
        import pickle

        import torch
        import torch._dynamo as dynamo

        class Scatter(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 16)

            def forward(self, x, index):
                out = torch.zeros(3, 16, device=x.device)
                return out.index_add_(0, index, self.lin(x).relu()).sum(-1) * 2.0

        def test_explain(device):
            model = Scatter().to(device)
            x = torch.randn(4, 8, device=device)
            index = torch.tensor([0, 1, 1, 2], device=device)
            explanation = dynamo.explain(model)(x, index)
            assert explanation.graph_count == 1, explanation.break_reasons
            assert explanation.graph_break_count == 0
            # the mode is back: device tensors are the device's again
            assert model(x, index).device.type == "mps"
            try:
                x + torch.ones(4, 8)
            except RuntimeError as exc:
                assert "found at least two devices" in str(exc)
            else:
                raise AssertionError("a host tensor beside a device one ran")

        def test_device_zero_is_the_accelerator():
            # torch.device stays PyTorch's own class: FX and pickle name it
            assert torch.device(0) == torch.device("mps", 0)
            assert type(torch.device(0)) is torch.device
            assert pickle.loads(pickle.dumps(torch.device(0))) == torch.device("mps", 0)
        """
    )
    result = run_emulated(pytester, monkeypatch)
    result.assert_outcomes(passed=2)


def test_dtypes_the_cpu_kernel_lacks_compute_as_on_a_mac(emulated: Emulation) -> None:
    from pytest_mps import ops

    table = ops.load_table()  # older torch releases lack some of these kernels
    x = torch.linspace(0.1, 2.0, 5, dtype=torch.float16, device="mps")
    if table.predict("aten::special_bessel_j0").outcome == "mps":
        got = torch.special.bessel_j0(x)
        assert got.dtype == torch.float16 and got.device == MPS
        want = torch.special.bessel_j0(x.cpu().float()).half()
        assert torch.equal(got.cpu(), want)
        out = torch.empty_like(x)
        torch.special.bessel_j0(x, out=out)
        assert torch.equal(out.cpu(), want)
    a = torch.rand(3, 4, dtype=torch.bfloat16, device="mps")
    assert torch.cdist(a, a).dtype == torch.bfloat16
    if table.predict("aten::polar").outcome == "mps":
        magnitude = torch.ones(2, dtype=torch.float16, device="mps")
        assert torch.polar(magnitude, magnitude).dtype == torch.complex32
    # where PyTorch's MPS lists say the Mac's kernel fails too, the CPU's
    # error stays (common_mps.py: linalg.eig is unimplemented on MPS)
    from pytest_mps.audit import expectations
    from pytest_mps.emulate import widen

    try:  # torch 2.6 ships no common_mps.py: nothing is listed
        lists = expectations.read_lists(expectations.common_mps_path())
    except expectations.SourceError:
        lists = None
    for func, key in ((torch.linalg.eig, "linalg.eig"), (torch.cdist, "cdist")):
        assert widen.opinfo_key(func) == key
        listed = lists and lists.verdict(key, "float16", (99, 0))
        assert widen.fails_on_mps(func, torch.float16, (99, 0)) == bool(
            listed and listed[0]
        )
    assert widen.opinfo_key(torch.special.bessel_j0) == "special.bessel_j0"
    assert widen.opinfo_key(torch.nn.functional.avg_pool3d) == (
        "nn.functional.avg_pool3d"
    )


def test_a_bad_index_is_a_device_side_assert(emulated: Emulation) -> None:
    error = getattr(torch, "AcceleratorError", RuntimeError)
    with pytest.raises(error, match="out of bounds"):
        torch.gather(torch.zeros(3, 4, device="mps"), 1, torch.tensor([[4]]).to("mps"))
    with pytest.raises(error, match=r"expects p to be in \[0, 1\]"):
        torch.bernoulli(torch.tensor([1.5], device="mps"))
    # integer indexing and empty dimensions are checked on the host, on a Mac too
    x = torch.ones(2, 5, device="mps")
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[0, 5]
    with pytest.raises(error, match="out of bounds"):
        x[:, [7]]
    # the CPU's own errors stay the CPU's
    with pytest.raises(RuntimeError, match="out of bounds") as caught:
        torch.gather(torch.zeros(3, 4), 1, torch.tensor([[4]]))
    assert type(caught.value) is not error or error is RuntimeError


def test_events_range_and_host_indices_work_as_on_a_mac(emulated: Emulation) -> None:
    start = torch.Event("mps", enable_timing=True)
    start.record()
    end = torch.Event("mps", enable_timing=True)
    end.record()
    assert isinstance(start, torch.Event) and start.device == MPS
    assert start.elapsed_time(end) >= 0 and end.query()
    made = torch.range(0, 3, device="mps")
    assert made.device == MPS and made.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    # tensor_split's indices are a CPU tensor by PyTorch's rule
    parts = torch.tensor_split(torch.arange(6.0, device="mps"), torch.tensor([2, 4]))
    assert [p.device for p in parts] == [MPS] * 3
    # sparse tensors run on a Mac's SparseMPS kernels, not judged by the dense table
    from pytest_mps import ops

    if ops.load_table().predict("aten::_to_sparse").outcome == "mps":
        sparse = torch.ones(2, 2, device="mps").to_sparse()
        assert sparse.to_dense().sum().item() == 4
    from pytest_mps.emulate.messages import NotEmulatedError

    with pytest.raises(NotEmulatedError, match="Philox offset"):
        torch.mps._get_default_mps_generator().get_offset()


def test_kernels_that_check_devices_speak_their_own_words(
    emulated: Emulation,
) -> None:
    device, host = torch.ones(3, device="mps"), torch.ones(3)
    same = "Expected all tensors to be on the same device. Found: mps:0, cpu"
    with pytest.raises(RuntimeError, match=same):
        torch.dot(device, host)
    with pytest.raises(RuntimeError, match=same):
        torch.vdot(device, host)
    with pytest.raises(
        RuntimeError,
        match=r"Expected elements.is_mps\(\) && test_elements.is_mps\(\), got "
        "mps:0 and cpu",
    ):
        torch.isin(device, host)


def test_autocast_keeps_in_float32_what_mps_autocast_keeps(emulated: Emulation) -> None:
    model = torch.nn.ConvTranspose3d(4, 3, 3, stride=2).to("mps")
    x = torch.randn(2, 4, 5, 6, 7, device="mps")
    with torch.autocast(device_type="mps"):
        y = model(x)
        z = torch.mm(torch.ones(2, 2, device="mps"), torch.ones(2, 2, device="mps"))
    assert y.dtype == torch.float32 and y.device == MPS
    assert z.dtype == torch.float16  # mm is cast down, as on a Mac


def test_where_and_gradient_name_both_devices(emulated: Emulation) -> None:
    device = torch.ones(3, 3, device="mps")
    with pytest.raises(RuntimeError, match=TWO_DEVICES.format("mps:0", "cpu")):
        torch.where(torch.ones(3, 3, dtype=torch.bool), device, device)
    with pytest.raises(
        RuntimeError,
        match="^torch.gradient expected each tensor to be on the same device, but "
        "got devices mps:0 and cpu!$",
    ):
        torch.gradient(device, spacing=[torch.tensor([1.0, 2.0, 4.0])], dim=0)
    assert torch.where(device > 0, device, 0.0).device == MPS
    assert torch.gradient(device, dim=0)[0].device == MPS


def test_data_of_more_than_16_dimensions_is_taken_as_on_a_mac(
    emulated: Emulation,
) -> None:
    # torch.tensor copies through empty_strided_mps, which has no limit;
    # a factory allocates through empty_mps, which has
    nested: list[object] = [float("nan")]
    for _ in range(24):
        nested = [nested]
    x = torch.tensor(nested, device="mps")
    assert x.dim() == 25 and x.device == MPS
    with pytest.raises(RuntimeError, match="dimensions <= 16, but got 25"):
        torch.zeros([1] * 25, device="mps")
