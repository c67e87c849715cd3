"""Host-sync detection on real CPU tensors (and meta tensors as the "device")."""

from __future__ import annotations

import pytest
import torch

# Import torch._dynamo here, in the outer process: pytester's in-process runs
# drop the modules first imported inside them, and a second import of it
# re-registers torch's test op libraries and fails (the watch mode imports it on
# torch versions without the C-level Dynamo skip, see pytest_mps/watch.py).
import torch._dynamo  # noqa: E402, F401

from pytest_mps import HostSyncError, forbid_host_sync

cpu = torch.arange(6.0)
meta = torch.empty(6, device="meta")

SYNCING = {
    "item": lambda t: t.sum().item(),
    "float": lambda t: float(t.sum()),
    "bool": lambda t: bool(t.sum() > 0),
    "if": lambda t: 1 if t.sum() > 0 else 0,
    "where_one_arg": lambda t: torch.where(t > 2),
    "nonzero": lambda t: t.nonzero(),
    "bool_mask_index": lambda t: t[t > 2],
    "bool_mask_assign_tensor": lambda t: t.clone().index_put_(
        (t > 2,), torch.zeros(3, device=t.device)
    ),
    "masked_select": lambda t: t.masked_select(t > 2),
    "unique": lambda t: t.unique(),
    "repeat_interleave": lambda t: t.repeat_interleave(
        torch.ones(6, dtype=torch.long, device=t.device)
    ),
    "bincount": lambda t: t.long().bincount(),
    "allclose": lambda t: torch.allclose(t, t),
    "equal": lambda t: torch.equal(t, t.clone()),
}
NOT_SYNCING = {
    "sum": lambda t: t.sum(),
    "sort": lambda t: t.sort(),
    "cumsum": lambda t: t.cumsum(0),
    "long_index": lambda t: t[torch.tensor([0, 2], device=t.device)],
    "repeat_interleave_with_size": lambda t: t.repeat_interleave(
        torch.ones(6, dtype=torch.long, device=t.device), output_size=6
    ),
    # ATen turns `t[mask] = scalar` into masked_fill_
    "bool_mask_assign_scalar": lambda t: t.clone().__setitem__(t > 2, 0.0),
    "equal_same_tensor": lambda t: torch.equal(t, t),
    "index_put_long": lambda t: t.clone().index_put_(
        (torch.tensor([1], device=t.device),), torch.zeros(1, device=t.device)
    ),
}


@pytest.mark.parametrize("name", sorted(SYNCING))
def test_ops_that_would_sync_on_a_gpu_fail_on_cpu_tensors_of_a_cpu_test(
    name: str,
) -> None:
    with pytest.raises(HostSyncError, match="makes the host wait"):
        with forbid_host_sync(count_cpu=True):
            SYNCING[name](cpu)


@pytest.mark.parametrize("name", sorted(SYNCING))
def test_cpu_tensors_do_not_count_when_the_test_runs_on_an_accelerator(
    name: str,
) -> None:
    with forbid_host_sync(count_cpu=False):
        SYNCING[name](cpu)


@pytest.mark.parametrize("name", sorted(NOT_SYNCING))
def test_ops_that_stay_on_the_device_pass(name: str) -> None:
    with forbid_host_sync(count_cpu=True):
        NOT_SYNCING[name](cpu)


def test_copies_between_host_and_device_sync_unless_non_blocking() -> None:
    with forbid_host_sync(count_cpu=False):
        cpu.to("meta", non_blocking=True)
        with pytest.raises(HostSyncError, match="Tensor.cpu .*blocking copy to the"):
            meta.cpu()
        with pytest.raises(HostSyncError, match="aten::_to_copy"):
            cpu.to("meta")
        with pytest.raises(HostSyncError, match="aten::copy_"):
            torch.empty(6).copy_(meta)


def test_item_on_a_device_tensor_fails_before_reaching_the_device() -> None:
    # meta tensors cannot be read back at all: the guard names the op first
    with forbid_host_sync(count_cpu=False):
        with pytest.raises(HostSyncError, match="aten::_local_scalar_dense"):
            meta.sum().item()


def test_inference_mode_item_is_decomposed_and_caught() -> None:
    with torch.inference_mode(), forbid_host_sync(count_cpu=True):
        with pytest.raises(HostSyncError, match="_local_scalar_dense"):
            cpu.sum().item()


def test_marker_fails_the_test_naming_the_op_and_the_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_loss_logging():
            loss = torch.ones(3).sum()
            print(f"loss {loss.item():.3f}")

        @pytest.mark.no_host_sync
        def test_stays_on_device():
            loss = torch.ones(3).sum()
            loss.mul_(2)

        def test_unmarked_may_sync():
            assert torch.ones(3).sum().item() == 3.0
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *HostSyncError: aten::_local_scalar_dense makes the host wait for "
            "the device (reads a value back*) at *test_marker_fails*.py:7; "
            "forbidden by @pytest.mark.no_host_sync",
            "ops that made the host wait for the device:",
            "  aten::_local_scalar_dense: 1 call(s) in 1 test(s)",
        ]
    )


def test_context_manager_in_a_user_test_follows_the_test_device(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch
        from pytest_mps import forbid_host_sync, HostSyncError

        def test_cpu_session_counts_cpu_tensors():
            with pytest.raises(HostSyncError, match="aten::nonzero"):
                with forbid_host_sync():
                    torch.where(torch.ones(2) > 0)
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_marker_is_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.no_host_sync:*"])


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("name", sorted(SYNCING))
def test_on_cuda_syncing_ops_fail_on_device_tensors(name: str) -> None:
    on_gpu = cpu.to("cuda")
    with pytest.raises(HostSyncError, match="makes the host wait"):
        with forbid_host_sync(count_cpu=False):
            SYNCING[name](on_gpu)


@cuda
@pytest.mark.parametrize("name", sorted(NOT_SYNCING))
def test_on_cuda_device_resident_ops_pass(name: str) -> None:
    on_gpu = cpu.to("cuda")
    with forbid_host_sync(count_cpu=False):
        NOT_SYNCING[name](on_gpu)


@cuda
def test_on_cuda_copies_to_the_host_sync_unless_non_blocking() -> None:
    on_gpu = cpu.to("cuda")
    with forbid_host_sync(count_cpu=False):
        on_gpu.to("cpu", non_blocking=True)
        with pytest.raises(HostSyncError, match="Tensor.tolist"):
            on_gpu.tolist()
    torch.cuda.synchronize()


def test_optimizer_step_counters_on_the_cpu_are_not_host_syncs(
    pytester: pytest.Pytester,
) -> None:
    # torch.optim keeps state["step"] on the CPU on every device and reads it
    # with .item() (optimizer.py, _get_value): no device to wait for.
    pytester.makepyfile(
        """
        import pytest
        import torch

        @pytest.mark.no_host_sync
        def test_train_step():
            model = torch.nn.Linear(4, 4)
            optimizer = torch.optim.AdamW(model.parameters())
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.step()

        @pytest.mark.no_host_sync
        def test_logging_the_loss_still_fails():
            model = torch.nn.Linear(4, 4)
            loss = model(torch.randn(2, 4)).pow(2).mean()
            print(loss.item())
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED *test_logging_the_loss_still_fails*"])


def test_expected_host_syncs_in_named_functions_pass_and_others_fail(
    expected_syncs_project: pytest.Pytester,
) -> None:
    pytester = expected_syncs_project
    pytester.makepyfile(
        test_loop="""
        import pytest, torch
        from evaluation import mean_loss, sloppy

        @pytest.mark.no_host_sync
        def test_expected():
            assert mean_loss(torch.ones(3)) == 1.0

        @pytest.mark.no_host_sync
        def test_unexpected():
            sloppy(torch.ones(3))
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*HostSyncError: aten::_local_scalar_dense makes the host wait*"
            "evaluation.py:5*"
        ]
    )


def test_a_bad_expected_host_sync_line_names_the_ini_option(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_expected_host_syncs = train.py:12\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*ini option mps_expected_host_syncs in *tox.ini: 'train.py:12' is not "
            "path::function*"
        ]
    )
