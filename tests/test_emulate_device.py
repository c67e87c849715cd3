"""Correct code runs on the emulated device as on a Mac, with the CPU's numbers.

The user's file below checks, on the device the emulation gives it, what a
Mac's MPS device does (device, printing, autograd, optimizers, nn.Module.to,
torch.save/load, autocast, generators, memory counters, events) and that
every result equals the CPU's bit for bit: the emulation changes where errors
come from, never the numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

MODEL = (
    Path(__file__).resolve().parent.parent
    / "template"
    / "{{cookiecutter.project_slug}}"
    / "src"
    / "{{cookiecutter.package_name}}"
    / "model.py"
)

DEVICE_TESTS = """
import copy
import importlib.util
import io
import sys
import zipfile

import pytest
import torch
import torch.nn.functional as F


def on_device(t):
    return t.device == torch.device("mps", 0) and t.is_mps and not t.is_cpu


def test_the_device_is_mps_and_prints_as_on_a_mac(device):
    assert device.type == "mps" and torch.backends.mps.is_available()
    x = torch.tensor([1.0, 2.0], device=device)
    assert on_device(x) and x.get_device() == 0
    assert repr(x) == "tensor([1., 2.], device='mps:0')"
    assert f"{x.sum():.1f}" == "3.0"
    assert x.tolist() == [1.0, 2.0] and x.sum().item() == 3.0
    host = x.cpu()
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    assert x.to(device) is x and x.to("mps:0") is x
    assert torch.accelerator.current_accelerator().type == "mps"


def test_ops_give_the_cpus_numbers_bit_for_bit(device):
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    image, kernel = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3)
    ids = torch.randint(0, 10, (6,))
    cases = {
        "matmul": lambda a, b, *_: a @ b,
        "softmax": lambda a, *_: F.softmax(a, -1),
        "gelu": lambda a, *_: F.gelu(a).cumsum(0),
        "layer_norm": lambda a, *_: F.layer_norm(a, (16,)),
        "conv2d": lambda _a, _b, image, kernel, _i: F.conv2d(image, kernel),
        "topk": lambda a, *_: a.topk(3, dim=-1).values,
        "embedding": lambda a, _b, _c, _d, ids: F.embedding(ids, a.T),
        "cross_entropy": lambda a, _b, _c, _d, ids: F.cross_entropy(a[:6], ids),
    }
    for name, case in cases.items():
        want = case(a, b, image, kernel, ids)
        got = case(*(t.to(device) for t in (a, b, image, kernel, ids)))
        assert on_device(got), name
        assert torch.equal(got.cpu(), want), name


def test_autograd_keeps_gradients_on_their_devices(device):
    host = torch.randn(4, 3, requires_grad=True)
    weight = torch.randn(3, 2, device=device, requires_grad=True)
    x = host.to(device)
    assert not x.is_leaf and x.grad_fn is not None
    (x @ weight).pow(2).sum().backward()
    assert on_device(weight.grad) and weight.is_leaf
    assert host.grad.device.type == "cpu" and type(host.grad) is torch.Tensor
    with torch.no_grad():
        assert not (weight * 2).requires_grad
    with torch.inference_mode():
        assert on_device(weight + 1)


def test_a_module_moves_keeping_its_parameters(device):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    weight = model[0].weight
    model.to(device)
    assert model[0].weight is weight
    assert isinstance(weight, torch.nn.Parameter) and on_device(weight)
    assert all(on_device(t) for t in model.state_dict().values())
    weight.data = weight.data.to("cpu")
    assert weight.device.type == "cpu" and isinstance(weight, torch.nn.Parameter)
    weight.data = weight.data.to(device)
    assert on_device(weight) and weight.requires_grad


@pytest.mark.parametrize("make", ["sgd", "adam", "adamw_fused", "adamw_foreach"])
def test_optimizers_step_as_on_the_cpu(device, make):
    def run(on):
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 3).to(on)
        optimizer = {
            "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=0.01),
            "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
            "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
        }[make](model.parameters())
        x = torch.randn(7, 5).to(on)
        for _ in range(3):
            model(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
        return model, optimizer

    cpu_model, _ = run("cpu")
    model, optimizer = run(device)
    for got, want in zip(model.parameters(), cpu_model.parameters()):
        assert on_device(got) and torch.equal(got.cpu(), want)
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim():
                assert on_device(value)


def test_the_templates_gpt_trains_a_step_as_on_the_cpu(device):
    spec = importlib.util.spec_from_file_location("gpt_model", MODEL)
    gpt = importlib.util.module_from_spec(spec)
    sys.modules["gpt_model"] = gpt
    spec.loader.exec_module(gpt)
    config = gpt.GPTConfig(
        vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1
    )

    def step(on):
        torch.manual_seed(3)
        model = gpt.GPT(config).to(on)
        optimizer = model.make_optimizer(0.1, 1e-3, (0.9, 0.95))
        x = torch.randint(0, 50, (4, 16)).to(on)
        y = torch.randint(0, 50, (4, 16)).to(on)
        torch.manual_seed(4)  # dropout's draws, from each device's generator
        for _ in range(2):
            _, loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return model, loss

    cpu_model, cpu_loss = step("cpu")
    model, loss = step(device)
    assert on_device(loss) and torch.equal(loss.cpu(), cpu_loss)
    for got, want in zip(model.parameters(), cpu_model.parameters()):
        assert torch.equal(got.cpu(), want)


def test_a_checkpoint_is_a_macs_checkpoint(device, tmp_path):
    model = torch.nn.Linear(3, 2).to(device)
    torch.save({"model": model.state_dict()}, tmp_path / "ckpt.pt")
    with zipfile.ZipFile(tmp_path / "ckpt.pt") as archive:
        pickled = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        assert b"mps" in archive.read(pickled)  # the storages' location tag
    back = torch.load(tmp_path / "ckpt.pt")["model"]
    assert all(on_device(t) for t in back.values())
    host = torch.load(tmp_path / "ckpt.pt", map_location="cpu")["model"]
    assert all(type(t) is torch.Tensor for t in host.values())
    assert torch.equal(host["weight"], model.weight.detach().cpu())
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    assert isinstance(again.weight, torch.nn.Parameter) and on_device(again.weight)
    assert on_device(copy.deepcopy(model).weight)


def test_autocast_casts_as_the_cpus_autocast_does(device):
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with torch.autocast("mps", dtype=torch.bfloat16):
        got = a.to(device) @ b.to(device)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = a @ b
    assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), want)
    assert (a @ b).dtype == torch.float32  # and it ends with the block


def test_generators_draw_the_cpus_numbers(device):
    torch.manual_seed(7)
    want = torch.randn(5)
    torch.manual_seed(7)
    assert torch.equal(torch.randn(5, device=device).cpu(), want)
    generator = torch.Generator(device=device).manual_seed(7)
    assert generator.device.type == "mps" and isinstance(generator, torch.Generator)
    assert torch.equal(torch.randn(5, device=device, generator=generator).cpu(), want)
    torch.mps.manual_seed(11)
    state = torch.mps.get_rng_state()
    first = torch.rand(3, device=device)
    torch.mps.set_rng_state(state)
    assert torch.equal(torch.rand(3, device=device), first)


def test_tensors_made_from_a_device_tensor_land_on_the_device(device):
    x = torch.ones(3, device=device)
    assert x.type() == "torch.mps.FloatTensor"
    made = {
        "new_tensor": x.new_tensor([1.0, 2.0, 3.0]),
        "type_as": torch.arange(3).type_as(x),
        "type": torch.arange(3.0).type("torch.mps.FloatTensor"),
        "new_zeros": x.new_zeros(3),
    }
    for name, t in made.items():
        assert on_device(t) and t.dtype == torch.float32, name
        assert (x + t).shape == (3,), name
    with pytest.warns(UserWarning, match="To copy construct from a tensor"):
        copied = x.new_tensor(torch.arange(3.0))
    assert on_device(copied) and copied.tolist() == [0.0, 1.0, 2.0]
    assert x.new_tensor([1, 2], device="cpu").device.type == "cpu"
    weight = torch.empty(3, device=device)
    torch.nn.init.normal_(weight, generator=torch.Generator(device).manual_seed(0))
    assert on_device(weight)
    y = x.clone().requires_grad_()
    (y * 2).sum().backward(torch.tensor(1.0))  # a 0-dim gradient is moved
    assert on_device(y.grad) and y.grad.tolist() == [2.0, 2.0, 2.0]


def test_memory_counters_and_events_follow_the_tensors(device):
    before = torch.mps.current_allocated_memory()
    big = torch.empty(2**20, device=device)  # 4 MiB
    assert torch.mps.current_allocated_memory() - before >= 4 * 2**20
    del big
    assert torch.mps.current_allocated_memory() - before < 4 * 2**20
    start = torch.mps.Event(enable_timing=True)
    end = torch.mps.Event(enable_timing=True)
    start.record()
    torch.ones(64, device=device).sum()
    end.record()
    torch.mps.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.0
"""


def test_correct_code_runs_on_the_emulated_device_with_the_cpus_numbers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_device=f"MODEL = {str(MODEL)!r}\n" + DEVICE_TESTS,
    )
    result = pytester.runpytest("--mps-emulate", "-p", "no:randomly", "-q")
    result.assert_outcomes(passed=14)
    assert torch.backends.mps.is_available() is False


def test_an_older_macos_refuses_bfloat16_as_pytorch_does(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        def test_bfloat16(device):
            with pytest.raises(TypeError) as refused:
                torch.ones(2, device=device, dtype=torch.bfloat16)
            assert str(refused.value) == (
                "MPS BFloat16 is only supported on MacOS 14 or newer"
            )
            assert not torch.backends.mps.is_macos_or_newer(14, 0)

        def test_float16_is_fine(device):
            assert torch.ones(2, device=device, dtype=torch.float16).sum() == 2
        """
    )
    result = pytester.runpytest("--mps-emulate", "--mps-emulate-macos=13.5")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["pytest-mps emulate: MPS emulated on the CPU (macOS 13.5*"]
    )


def test_threads_and_dataloader_workers_see_the_emulated_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor

        import pytest
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        class Worker(threading.Thread):
            def run(self):
                self.made = torch.arange(3.0, device="mps")

        def test_a_thread_makes_device_tensors(device):
            worker = Worker()
            worker.start()
            worker.join()
            assert worker.made.is_mps and worker.made.sum().item() == 3.0
            assert "run" not in vars(worker)  # the instance is left as it was

        def test_a_pool_thread_fails_as_on_a_mac(device):
            x = torch.ones(3, device=device)
            with ThreadPoolExecutor(2) as pool:
                made = list(pool.map(lambda n: torch.ones(n, device="mps"), [1, 2]))
                mixed = pool.submit(lambda: x + torch.arange(3.0))
            assert all(t.is_mps for t in made)
            with pytest.raises(RuntimeError, match="two devices, mps:0 and cpu"):
                mixed.result()

        @pytest.mark.parametrize("pin", [False, True])
        def test_dataloader_workers_feed_the_device(device, pin):
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
            loader = DataLoader(data, batch_size=4, num_workers=2, pin_memory=pin)
            model = torch.nn.Linear(4, 1)
            twin = torch.nn.Linear(4, 1).to(device)
            twin.load_state_dict(model.state_dict())
            for x, y in loader:
                want = torch.nn.functional.mse_loss(model(x), y)
                got = torch.nn.functional.mse_loss(twin(x.to(device)), y.to(device))
                assert got.is_mps and torch.equal(got.cpu(), want)
        """
    )
    result = pytester.runpytest_subprocess("--mps-emulate", "-p", "no:randomly")
    result.assert_outcomes(passed=4)


MEMORY_TESTS = """
import gc

import pytest
import torch

GIB = 2**30
OUT_OF_MEMORY = (
    "MPS backend out of memory (MPS allocated: 6.00 GiB, other allocations: "
    "0 bytes, max allowed: 10.20 GiB). Tried to allocate 5.00 GiB on private "
    "pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for "
    "memory allocations (may cause system failure)."
)


def empty(gib, device):
    # torch.empty reserves pages it never touches: no real memory is used
    return torch.empty(gib * GIB, dtype=torch.uint8, device=device)


def test_an_8gb_mac_refuses_past_its_limit(device):
    # 75% of 8 GiB is the working set; 1.7 times that is allowed
    assert torch.mps.recommended_max_memory() == 6 * GIB
    first = empty(6, device)
    view = first[:GIB]  # a view holds no memory of its own
    host = torch.empty(6 * GIB, dtype=torch.uint8)  # nor does the host
    with pytest.raises(RuntimeError) as refused:
        empty(5, device)
    assert str(refused.value) == OUT_OF_MEMORY
    del first, view, host
    gc.collect()
    second = empty(5, device)  # the memory came back with the tensors
    assert torch.mps.current_allocated_memory() == 5 * GIB


def test_a_memory_fraction_lowers_the_limit(device):
    torch.mps.set_per_process_memory_fraction(0.5)
    try:
        with pytest.raises(RuntimeError, match=r"max allowed: 3.00 GiB\\)"):
            empty(4, device)
    finally:
        torch.mps.set_per_process_memory_fraction(1.7)


def test_eleven_gib_fit(device):
    held = [empty(6, device), empty(5, device)]
    assert sum(t.numel() for t in held) == 11 * GIB
"""


def test_a_macs_memory_size_sets_pytorchs_out_of_memory_limit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_memory=MEMORY_TESTS)
    small = pytester.runpytest_subprocess(
        "--mps-emulate", "--mps-emulate-memory=8GB", "-k", "not eleven"
    )
    small.assert_outcomes(passed=2)
    large = pytester.runpytest_subprocess(
        "--mps-emulate", "--mps-emulate-memory=64GB", "-k", "eleven"
    )
    large.assert_outcomes(passed=1)
    too_small = pytester.runpytest_subprocess(
        "--mps-emulate", "--mps-emulate-memory=8GB", "-k", "eleven"
    )
    too_small.assert_outcomes(failed=1)
    too_small.stdout.fnmatch_lines(
        ["E *RuntimeError: MPS backend out of memory (MPS allocated: 6.00 GiB, *"]
    )
    monkeypatch.setenv("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "0.0")
    unlimited = pytester.runpytest_subprocess(
        "--mps-emulate", "--mps-emulate-memory=8GB", "-k", "eleven"
    )
    unlimited.assert_outcomes(passed=1)
    unlimited.stdout.fnmatch_lines(
        [
            "pytest-mps emulate: memory 8.00 GiB: recommended working set 6.00 GiB, "
            "no limit (PYTORCH_MPS_HIGH_WATERMARK_RATIO=0)"
        ]
    )


ZOO_ON_THE_DEVICE = """
import copy

CASES = {
    "gpt": (GPT, lambda: torch.randint(0, 32, (2, 16)),
            lambda out, x: F.cross_entropy(out.view(-1, out.size(-1)), x.view(-1))),
    "resnet": (ResNet, lambda: torch.randn(4, 3, 16, 16),
               lambda out, x: out.square().mean()),
    "vit_block": (ViTBlock, lambda: torch.randn(2, 3, 16, 16),
                  lambda out, x: out.square().mean()),
    "unet_block": (UNetBlock, lambda: torch.randn(2, 3, 16, 16),
                   lambda out, x: F.mse_loss(out, x)),
    "lstm_lm": (LSTMLM, lambda: torch.randint(0, 32, (2, 12)),
                lambda out, x: F.cross_entropy(out.reshape(-1, 32), x.reshape(-1))),
    "moe_layer": (MoE, lambda: torch.randn(8, 16), lambda out, x: out.pow(2).mean()),
}


def step(model, x, loss_of):
    torch.manual_seed(1)  # dropout draws from each device's own generator
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = loss_of(model(x), x)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_device_trains_as_the_cpu(device, name):
    make, inputs, loss_of = CASES[name]
    torch.manual_seed(0)
    model, x = make(), inputs()
    twin = copy.deepcopy(model).to(device)
    want = step(model, x, loss_of)
    got = step(twin, x.to(device), loss_of)
    assert got.is_mps and torch.equal(got.cpu(), want)
    for mine, theirs in zip(twin.parameters(), model.parameters()):
        assert mine.is_mps and torch.equal(mine.cpu(), theirs)
"""


def test_the_zoo_trains_on_the_emulated_device_with_the_cpus_numbers(
    pytester: pytest.Pytester,
) -> None:
    from test_audit_zoo import ZOO

    pytester.makepyfile(test_zoo=ZOO + ZOO_ON_THE_DEVICE)
    result = pytester.runpytest("--mps-emulate", "-k", "the_device_trains")
    result.assert_outcomes(passed=6)


def test_device_parity_holds_against_the_cpu_on_the_emulated_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_mps import assert_device_parity

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.LayerNorm(32)
                self.mlp = torch.nn.Sequential(
                    torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)
                )

            def forward(self, x):
                return x + self.mlp(self.norm(x))

        class DriftsOnTheDevice(Block):
            # what a kernel that is wrong on MPS looks like from outside
            def forward(self, x):
                out = super().forward(x)
                return out * 1.01 if out.device.type == "mps" else out

        def test_fixture(device_parity):
            device_parity(Block(), torch.randn(2, 8, 32), steps=2)

        def test_function():
            report = assert_device_parity(Block(), torch.randn(2, 8, 32), device="mps")
            assert (report.reference, report.target) == ("cpu", "mps:0")
            paths = [d.path for d in report.diffs]
            # the output, and the input's and every parameter's gradient
            assert "output" in paths, paths
            assert sum("grad" in p for p in paths) >= 6, paths
            assert report.failed == []

        def test_a_device_that_computes_otherwise_fails():
            x = torch.randn(2, 8, 32)
            assert_device_parity(DriftsOnTheDevice(), x, device="mps")
        """
    )
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * 8 of 8 leaves differ between the reference (cpu) and the device "
            "(mps:0)",
            "E * output * float32 * (2, 8, 32) *",
        ]
    )


def test_torch_compile_runs_eagerly_and_says_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_compiled(device):
            model = torch.nn.Linear(4, 2).to(device)
            compiled = torch.compile(model, mode="max-autotune")
            x = torch.randn(3, 4, device=device)
            assert torch.equal(compiled(x), model(x))

            @torch.compile(fullgraph=True)
            def double(t):
                return t * 2

            assert double(x).is_mps
        """
    )
    result = pytester.runpytest("--mps-emulate", "-W", "default")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*UserWarning: torch.compile runs the function eagerly under --mps-emulate*"]
    )


def test_a_default_device_of_mps_makes_tensors_on_the_emulated_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_default_device():
            torch.set_default_device("mps")
            try:
                assert torch.zeros(2).is_mps and torch.arange(3).is_mps
                assert torch.nn.Linear(2, 2).weight.is_mps
            finally:
                torch.set_default_device(None)
            assert not torch.zeros(2).is_mps

        def test_device_block():
            with torch.device("mps"):
                x = torch.randn(3)
            assert x.is_mps and not torch.randn(3).is_mps
        """
    )
    pytester.runpytest("--mps-emulate").assert_outcomes(passed=2)


def test_a_cpu_gradient_or_a_cpu_input_to_a_device_output_raises_as_on_a_mac(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_cpu_gradient(device):
            y = torch.ones(3, device=device, requires_grad=True) * 2
            y.backward(torch.ones(3))

        def test_cpu_inputs_into_a_device_out(device):
            out = torch.empty(3, device=device)
            torch.add(torch.ones(3), torch.ones(3), out=out)
        """
    )
    result = pytester.runpytest("--mps-emulate", "--tb=line")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "*RuntimeError: invalid gradient at index 0 - expected device mps:0 "
            "but got cpu",
            "*RuntimeError: Expected all tensors to be on the same device, but "
            "found at least two devices, mps:0 and cpu!",
        ]
    )


def test_the_devices_stream_is_there_and_never_captures(
    pytester: pytest.Pytester,
) -> None:
    # torch 2.15's optimizers ask the accelerator's stream whether it is being
    # captured into a graph before each step; MPS has no graph capture
    pytester.makepyfile(
        """
        import torch

        def test_stream(device):
            stream = torch.accelerator.current_stream()
            assert stream.device_type == "mps" and not stream.is_capturing()
            stream.synchronize()
            if hasattr(torch.mps, "current_stream"):
                assert torch.mps.current_stream() == stream

        def test_adam_steps(device):
            weight = torch.nn.Parameter(torch.ones(3, device=device))
            optimizer = torch.optim.Adam([weight], lr=0.1)
            weight.sum().backward()
            optimizer.step()
            assert weight.is_mps and weight.detach().cpu().lt(1).all()
        """
    )
    import torch

    before = torch.accelerator.current_stream
    result = pytester.runpytest("--mps-emulate")
    result.assert_outcomes(passed=2)
    assert torch.accelerator.current_stream is before  # torch's own again
