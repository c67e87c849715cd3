"""The parts of a torchrun run that one process can check: no process group here.

Two real processes train in the template repository's own tests (gloo on the CPU).
"""

import pytest
import torch

from {{ cookiecutter.package_name }}.data import Batches
from {{ cookiecutter.package_name }}.distributed import (
    Dist,
    device_for,
    from_env,
    gather,
    mean,
    micro_steps,
)
from {{ cookiecutter.package_name }}.errors import ConfigError, DeviceError


def test_without_torchrun_there_is_one_process():
    assert from_env({}) == Dist(rank=0, local_rank=0, world_size=1)
    assert not from_env({}).enabled and from_env({}).is_main


def test_torchruns_environment_is_read():
    dist = from_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert dist == Dist(1, 1, 2) and dist.enabled and not dist.is_main


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2, LOCAL_RANK=0, WORLD_SIZE=2"),
    ],
)
def test_a_broken_environment_is_named(env, message):
    with pytest.raises(ConfigError, match=message):
        from_env(env)


def test_the_micro_batches_are_shared_out_evenly():
    assert micro_steps(8, Dist(0, 0, 4)) == 2
    assert micro_steps(3, Dist()) == 3
    with pytest.raises(
        ConfigError,
        match=r"gradient_accumulation_steps=3 is not divisible by WORLD_SIZE=2"
        r".*pass --gradient_accumulation_steps=2",
    ):
        micro_steps(3, Dist(0, 0, 2))


def test_mps_refuses_several_processes_with_the_reason():
    with pytest.raises(DeviceError, match="WORLD_SIZE=2 .* MPS, which has no multi"):
        device_for("auto", Dist(0, 0, 2), mps_available=True, cuda_count=0)
    with pytest.raises(DeviceError, match="--device=mps means MPS"):
        device_for("mps", Dist(1, 1, 2), mps_available=True, cuda_count=0)
    assert device_for("mps", Dist(), mps_available=True, cuda_count=0) == "mps"


def test_each_process_takes_the_gpu_of_its_local_rank():
    assert device_for("auto", Dist(3, 1, 4), False, cuda_count=2) == "cuda:1"
    assert device_for("cuda", Dist(1, 0, 2), False, cuda_count=1) == "cuda:0"
    assert device_for("auto", Dist(1, 1, 2), False, cuda_count=0) == "cpu"
    assert device_for("cpu", Dist(1, 1, 2), True, cuda_count=8) == "cpu"
    with pytest.raises(DeviceError, match="LOCAL_RANK=2 has no GPU: .* 2 CUDA"):
        device_for("auto", Dist(2, 2, 3), False, cuda_count=2)
    with pytest.raises(DeviceError, match="--device=cuda:1: under torchrun"):
        device_for("cuda:1", Dist(0, 0, 2), False, cuda_count=2)


def test_one_process_needs_no_collectives():
    value = torch.tensor(2.5)
    assert mean(value, Dist()) is value
    assert gather({"a": 1}, Dist()) == [{"a": 1}]


def test_split_batch_streams_draw_the_same_global_batch():
    tokens = torch.arange(1000)
    one = Batches(tokens, 16, 4, seed=7, slots=range(0, 2))
    rank0 = Batches(tokens, 16, 4, seed=7, slots=range(0, 1))
    rank1 = Batches(tokens, 16, 4, seed=7, slots=range(1, 2))
    for _ in range(3):
        for part in (rank0, rank1):
            x_one, y_one = one.next()
            x, y = part.next()
            assert torch.equal(x, x_one) and torch.equal(y, y_one)
    merged = {**rank0.state_dict(), **rank1.state_dict()}
    assert sorted(merged) == [0, 1]
    resumed = Batches(tokens, 16, 4, seed=0, slots=range(0, 2))
    resumed.load_state_dict(merged)
    assert torch.equal(resumed.next()[0], one.next()[0])
    with pytest.raises(KeyError, match=r"slots \[0, 1\]; this run needs \[2, 3\]"):
        Batches(tokens, 16, 4, seed=7, slots=range(2, 4)).load_state_dict(merged)
