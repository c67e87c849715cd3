"""Every read of tensor data back to Python is found on the CPU as on a GPU.

One user test per read, marked ``no_host_sync`` and run on every device this
machine has (the CPU; CUDA where present): each must fail naming the same op
at the same line on every device, and reads of metadata must pass.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

# pytester's in-process runs drop the modules first imported inside them; a
# second import of torch._dynamo re-registers torch's test ops and fails.
import torch._dynamo  # noqa: F401

pytest_plugins = ["pytester"]

#: read -> (the statement, on ``t`` made on the test's device; the op named)
READS = {
    "item": ("t.sum().item()", "aten::_local_scalar_dense"),
    "bool": ("bool(t.sum() > 0)", "aten::_local_scalar_dense"),
    "if": ("1 if t.sum() > 0 else 0", "aten::_local_scalar_dense"),
    "int": ("int(t[0])", "aten::_local_scalar_dense"),
    "float": ("float(t[1])", "aten::_local_scalar_dense"),
    "index": ("[0, 1, 2][t.long()[1]]", "aten::_local_scalar_dense"),
    "format_scalar": ('f"{t.sum():.3f}"', "Tensor.__format__"),
    "format": ('f"{t}"', "Tensor.__format__"),
    "tolist": ("t.tolist()", "Tensor.tolist"),
    "numpy": ("t.numpy()", "Tensor.numpy"),
    "array": ("numpy.asarray(t)", "Tensor.__array__"),
    "repr": ("repr(t)", "Tensor.__repr__"),
    "str": ("str(t)", "Tensor.__repr__"),
    "print": ("print(t)", "Tensor.__repr__"),
    "equal": ("torch.equal(t, t + 1)", "aten::equal"),
    "allclose": ("torch.allclose(t, t + 1)", "aten::allclose"),
    "iterate": ("[x for x in t]", "Tensor.__iter__"),
    "cpu": ("t.cpu()", "Tensor.cpu"),
    "to_cpu": ('t.to("cpu")', "Tensor.to"),
}

if importlib.util.find_spec("numpy") is None:  # torch runs without NumPy
    del READS["numpy"], READS["array"]

#: reads of metadata, and calls that stay where the data is: never a read
NOT_READS = {
    "shape": "t.shape",
    "dtype": "t.dtype",
    "device": "t.device",
    "numel": "t.numel()",
    "len": "len(t)",
    "size_dim": "t.size(0) + t.dim()",
    "rows": "list(t.view(2, 3))",
    "to_own_device": "t.to(device)",
    "to_cpu_non_blocking": 't.to("cpu", non_blocking=True)',
}


def _user_file() -> str:
    lines = ["import pytest", "import torch", ""]
    if "array" in READS:
        lines.insert(0, "import numpy")
    for name, (statement, _) in {
        **READS,
        **{k: (v, "") for k, v in NOT_READS.items()},
    }.items():
        lines += [
            "",
            "@pytest.mark.no_host_sync",
            f"def test_{name}(device):",
            "    t = torch.arange(6.0, device=device)",
            f"    {statement}",
        ]
    return "\n".join(lines) + "\n"


def _devices() -> list[str]:
    return ["cpu", *(["cuda:0"] if torch.cuda.is_available() else [])]


def test_every_host_read_is_found_alike_on_every_device(
    pytester: pytest.Pytester,
) -> None:
    source = _user_file()
    pytester.makepyfile(test_reads=source)
    devices = _devices()
    options = [f"--device={d}" for d in devices]
    result = pytester.runpytest(*options, "--mps-report=report.json", "-p", "no:xdist")
    result.assert_outcomes(
        failed=len(READS) * len(devices), passed=len(NOT_READS) * len(devices)
    )
    report = json.loads((pytester.path / "report.json").read_text())
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for entry in report["watch"]["host-sync"]:
        for test in entry["tests"]:
            name, _, device = test["nodeid"].partition("::test_")[2].partition("[")
            found[(name, device.rstrip("]"))] = (entry["op"], test["location"])
    lines = source.splitlines()
    for name, (statement, op) in READS.items():
        line = lines.index(f"    {statement}", lines.index(f"def test_{name}(device):"))
        for device in devices:
            assert found.get((name, device)) == (op, f"test_reads.py:{line + 1}"), (
                name,
                device,
            )
    assert {name for name, _ in found} == set(READS)
