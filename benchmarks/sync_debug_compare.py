"""pytest-mps's host-sync check against ``torch.cuda.set_sync_debug_mode("error")``.

Runs each snippet twice on a CUDA device: once under PyTorch's sync debug mode
(which raises at the first synchronizing CUDA call) and once under
``forbid_host_sync(count_cpu=False)`` (which raises at the first aten op that
would make the host wait). Prints a markdown table: agree or differ, with the
op ours named and an explanation for each known difference.

Usage: ``python benchmarks/sync_debug_compare.py [--json PATH]`` (needs CUDA).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_mps.watch.host_sync import HostSyncError, forbid_host_sync  # noqa: E402

DEV = "cuda"


def inputs() -> dict[str, Any]:
    torch.manual_seed(0)
    x = torch.randn(64, device=DEV)
    return {
        "x": x,
        "y": x.clone(),
        "m": x > 0,
        "idx": torch.tensor([1, 3, 5], device=DEV),
        "counts": torch.randint(0, 8, (64,), device=DEV),
        "reps": torch.ones(64, dtype=torch.long, device=DEV),
        "c": torch.randn(64),
        "pinned": torch.randn(64).pin_memory(),
        "a": torch.randn(4, 4, device=DEV) + 4 * torch.eye(4, device=DEV),
        "p": torch.softmax(torch.randn(8, device=DEV), 0),
        "w": torch.nn.Parameter(torch.randn(8, 8, device=DEV)),
    }


def _setitem(t: torch.Tensor, key: Any, value: Any) -> None:
    t[key] = value


def _if(t: torch.Tensor) -> int:
    return 1 if t.sum() > 0 else 0


def _clip(w: torch.nn.Parameter) -> None:
    w.grad = torch.ones_like(w)
    torch.nn.utils.clip_grad_norm_([w], 1.0)


SNIPPETS: list[tuple[str, str, Callable[[dict[str, Any]], object]]] = [
    ("item", "x.sum().item()", lambda v: v["x"].sum().item()),
    ("float", "float(x.sum())", lambda v: float(v["x"].sum())),
    ("bool", "bool(x.sum() > 0)", lambda v: bool(v["x"].sum() > 0)),
    ("if", "if x.sum() > 0: ...", lambda v: _if(v["x"])),
    ("tolist", "x.tolist()", lambda v: v["x"].tolist()),
    ("cpu", "x.cpu()", lambda v: v["x"].cpu()),
    ("repr", "repr(x)", lambda v: repr(v["x"])),
    (
        "cpu_non_blocking",
        "x.to('cpu', non_blocking=True)",
        lambda v: v["x"].to("cpu", non_blocking=True),
    ),
    ("h2d_blocking", "c.to('cuda')  (pageable)", lambda v: v["c"].to(DEV)),
    (
        "h2d_non_blocking_pinned",
        "pinned.to('cuda', non_blocking=True)",
        lambda v: v["pinned"].to(DEV, non_blocking=True),
    ),
    (
        "tensor_ctor_on_device",
        "torch.tensor([1.0, 2.0], device='cuda')",
        lambda v: torch.tensor([1.0, 2.0], device=DEV),
    ),
    ("nonzero", "x.nonzero()", lambda v: v["x"].nonzero()),
    ("where_one_arg", "torch.where(m)", lambda v: torch.where(v["m"])),
    (
        "where_three_args",
        "torch.where(m, x, 0.0)",
        lambda v: torch.where(v["m"], v["x"], 0.0),
    ),
    ("bool_mask_index", "x[m]", lambda v: v["x"][v["m"]]),
    ("bool_mask_assign_scalar", "y[m] = 0.0", lambda v: _setitem(v["y"], v["m"], 0.0)),
    (
        "bool_mask_assign_tensor",
        "y[m] = x[m]",
        lambda v: _setitem(v["y"], v["m"], v["x"][v["m"]]),
    ),
    ("long_index", "x[idx]", lambda v: v["x"][v["idx"]]),
    (
        "index_put_long",
        "y.index_put_((idx,), x[:3])",
        lambda v: v["y"].index_put_((v["idx"],), v["x"][:3]),
    ),
    ("cpu_0dim_index", "x[torch.tensor(1)]", lambda v: v["x"][torch.tensor(1)]),
    ("masked_select", "x.masked_select(m)", lambda v: v["x"].masked_select(v["m"])),
    ("masked_fill", "x.masked_fill(m, 0.0)", lambda v: v["x"].masked_fill(v["m"], 0.0)),
    ("unique", "counts.unique()", lambda v: v["counts"].unique()),
    (
        "repeat_interleave",
        "x.repeat_interleave(reps)",
        lambda v: v["x"].repeat_interleave(v["reps"]),
    ),
    (
        "repeat_interleave_output_size",
        "x.repeat_interleave(reps, output_size=64)",
        lambda v: v["x"].repeat_interleave(v["reps"], output_size=64),
    ),
    (
        "repeat_interleave_int",
        "x.repeat_interleave(2)",
        lambda v: v["x"].repeat_interleave(2),
    ),
    ("bincount", "counts.bincount()", lambda v: v["counts"].bincount()),
    ("allclose", "torch.allclose(x, x)", lambda v: torch.allclose(v["x"], v["x"])),
    ("equal", "torch.equal(x, y)", lambda v: torch.equal(v["x"], v["y"])),
    ("equal_same_tensor", "torch.equal(x, x)", lambda v: torch.equal(v["x"], v["x"])),
    ("multinomial", "torch.multinomial(p, 4)", lambda v: torch.multinomial(v["p"], 4)),
    (
        "randperm",
        "torch.randperm(64, device='cuda')",
        lambda v: torch.randperm(64, device=DEV),
    ),
    ("sort", "x.sort()", lambda v: v["x"].sort()),
    ("cumsum", "x.cumsum(0)", lambda v: v["x"].cumsum(0)),
    ("argmax", "x.argmax()", lambda v: v["x"].argmax()),
    ("cpu_0dim_scalar", "x * torch.tensor(2.0)", lambda v: v["x"] * torch.tensor(2.0)),
    ("linalg_inv", "torch.linalg.inv(a)", lambda v: torch.linalg.inv(v["a"])),
    ("linalg_inv_ex", "torch.linalg.inv_ex(a)", lambda v: torch.linalg.inv_ex(v["a"])),
    ("clip_grad_norm", "clip_grad_norm_([w], 1.0)", lambda v: _clip(v["w"])),
    (
        "nonzero_static",
        "torch.nonzero_static(x, size=8)",
        lambda v: torch.nonzero_static(v["x"], size=8),
    ),
    (
        "cuda_synchronize",
        "torch.cuda.synchronize()",
        lambda v: torch.cuda.synchronize(),
    ),
    (
        "item_inference_mode",
        "with inference_mode(): x.sum().item()",
        lambda v: _in_inference(lambda: v["x"].sum().item()),
    ),
]

# Why ours and PyTorch's sync debug mode differ, where they do (filled from runs).
EXPLAIN = {
    "repr": (
        "torch/_tensor_str.py formats under _disable_current_modes(), so no "
        "dispatch mode sees its copy to the host"
    ),
    "cuda_synchronize": (
        "not an aten op: no dispatch mode sees it; an explicit synchronize is "
        "the user's own choice"
    ),
    "tensor_ctor_on_device": (
        "torch.tensor(data, device=) copies inside the Python binding, below the "
        "dispatcher's Python key"
    ),
}


def _in_inference(fn: Callable[[], object]) -> object:
    with torch.inference_mode():
        return fn()


def run_cuda(fn: Callable[[dict[str, Any]], object]) -> tuple[bool, str]:
    values = inputs()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(values)
    except RuntimeError as exc:
        if "synchroniz" in str(exc):
            return True, str(exc).splitlines()[0][:60]
        return False, f"error: {exc}"[:60]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    return False, ""


def run_ours(fn: Callable[[dict[str, Any]], object]) -> tuple[bool, str]:
    values = inputs()
    torch.cuda.synchronize()
    try:
        with forbid_host_sync(count_cpu=False):
            fn(values)
    except HostSyncError as exc:
        return True, str(exc).split(" ", 1)[0]
    except Exception as exc:  # noqa: BLE001
        return False, f"error: {type(exc).__name__}"
    finally:
        torch.cuda.synchronize()
    return False, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    rows = []
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}: "
        'set_sync_debug_mode("error") vs forbid_host_sync(count_cpu=False)'
    )
    print("| snippet | code | CUDA sync debug | pytest-mps | agree | note |")
    print("|---|---|---|---|---|---|")
    for name, code, fn in SNIPPETS:
        cuda_sync, cuda_note = run_cuda(fn)
        ours_sync, ours_op = run_ours(fn)
        agree = cuda_sync == ours_sync
        note = "" if agree else EXPLAIN.get(name, "unexplained")
        if ours_op.startswith("error") or cuda_note.startswith("error"):
            note = f"{note} {cuda_note} {ours_op}".strip()
        rows.append(
            {
                "snippet": name,
                "code": code,
                "cuda_syncs": cuda_sync,
                "ours_flags": ours_sync,
                "ours_op": ours_op,
                "agree": agree,
                "note": note,
            }
        )
        print(
            f"| {name} | `{code}` | {'sync' if cuda_sync else '-'} | "
            f"{ours_op if ours_sync else '-'} | {'yes' if agree else 'DIFFER'} | "
            f"{note} |"
        )
    agreed = sum(r["agree"] for r in rows)
    print(f"\n{agreed}/{len(rows)} agree")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
