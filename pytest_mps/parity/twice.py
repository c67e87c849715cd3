"""Same device, same inputs, two answers: the run-twice check.

On M5, ``F.linear`` gave different results on consecutive calls with the same
inputs ("Diff between runs: 123.5", pytorch#180776); it corrupted training.
:func:`assert_reproducible` runs a module or function twice on one device,
seeded alike, and fails when any output, gradient or parameter differs
between the runs. Each aten op's outputs of the first run are kept on the
host; in the second run the first op whose outputs differ from the first
run's is named: every op before it gave the same outputs, so it had the same
inputs, and it alone answered differently. ``assert_device_parity(...,
twice=True)`` adds the same check to a parity check.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pytest_mps.assertions import argument_names
from pytest_mps.parity.arguments import device_named, validate
from pytest_mps.parity.compare import compare, compare_runs, dtype_name
from pytest_mps.parity.findings import Localization, WrongOp
from pytest_mps.parity.layers import Names
from pytest_mps.parity.localize import (
    Recorder,
    describe,
    item,
    named_inputs,
    recording,
    to_host,
)
from pytest_mps.parity.run import Plan, make_plan, rng_restored, run
from pytest_mps.watch.attribution import plugin_work

if TYPE_CHECKING:
    import torch

#: the first run's op outputs kept on the host, at most
KEPT_BYTES = 1 << 30


class NotReproducible(AssertionError):
    """Two runs differ; ``differs`` is the first op that answered differently."""

    def __init__(self, message: str, differs: WrongOp | None) -> None:
        super().__init__(message)
        self.differs = differs


class TwiceRecorder(Recorder):
    """Keeps the first run's op outputs; finds the first op the second changes."""

    def __init__(self, device: str, root_name: str, tolerances: Any) -> None:
        super().__init__(device, root_name, tolerances)
        self.root_name = root_name
        #: the first run's outputs by (op, its call count of that op): the
        #: runs may differ by one-time ops (a cuDNN RNN's first call), which
        #: would shift a plain index onto another op's outputs
        self.first: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.calls: dict[str, int] = {}
        self.kept = 0
        self.full = False  # the first run outgrew KEPT_BYTES: later ops unkept
        self.second = False
        self.differs: WrongOp | None = None

    def start_second(self) -> None:
        """The first run is over: compare from now on."""
        self.second = True
        self.calls = {}
        self.found = Localization(self.found.device)
        self.modules = Names(self.root_name)
        self.nodes = {}

    def _judge(
        self, func: Any, name: str, host_args: Any, host_kwargs: Any, out: Any
    ) -> None:
        import torch
        from torch.utils import _pytree

        outs = [
            to_host(t) for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
        ]
        key = (name, self.calls.get(name, 0))
        self.calls[name] = key[1] + 1
        if not self.second:
            size = sum(t.numel() * t.element_size() for t in outs)
            if self.kept + size > KEPT_BYTES:
                self.full = True
            if not self.full:
                self.kept += size
                self.first[key] = outs
            return
        index = self.found.ops - 1
        kept = self.first.get(key)
        if self.differs is not None or kept is None:
            return
        rtol, atol = self.tolerances
        for i, (a, b) in enumerate(zip(kept, outs, strict=False)):
            if a.shape != b.shape or a.dtype != b.dtype or a.is_complex():
                continue
            label = "output" if len(outs) == 1 else f"output {i}"
            diff = compare(label, a, b, rtol, atol, dtype_name(b.dtype))
            if diff.ok:
                continue
            at = diff.worst or ()
            self.differs = WrongOp(
                index=index,
                op=name,
                site=self.site(),
                inputs=[
                    describe(n, t)
                    for n, t in named_inputs(func, host_args, host_kwargs)
                ],
                diff=diff,
                output=describe(label, b),
                device_value=item(b, at),
                cpu_value=item(a, at),
            )
            return


def twice(
    where: str,
    plan: Plan,
    target: torch.device,
    tolerances: tuple[float, float],
    dtype: torch.dtype | None = None,
) -> tuple[list[str], WrongOp | None]:
    """Run ``plan`` twice on ``target`` (in ``dtype``).

    Returns the failure's lines (none when the runs agree) and the first op
    whose outputs differ.
    """
    recorder = TwiceRecorder(str(target), plan.name, tolerances)
    # the plugin's own work (copies, the float64 comparison); the first run's
    # calls into the user's code are the user's, judged by --mps-audit
    with plugin_work(), _deterministic(target):
        with rng_restored([target]):
            with recording(recorder):
                first = run(plan, target, dtype, checked=True)
            ops = recorder.found.ops
            recorder.start_second()
            with recording(recorder):
                second = run(plan, target, dtype, checked=False)
        sides = (f"the first run ({target})", f"the second run ({target})")
        diffs, problems, _ = compare_runs(
            first, second, target, sides, False, tolerances
        )
    failed = [d.path for d in diffs if not d.ok]
    if not failed and not problems and recorder.differs is None:
        return [], None
    rule = (
        "bit for bit"
        if tolerances == (0.0, 0.0)
        else f"rtol={tolerances[0]:g}, atol={tolerances[1]:g}"
    )
    shown = ", ".join(failed[:5]) + (
        f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    )
    lines = [
        f"{where}: two runs on {target} from the same inputs and seed differ "
        f"({rule}): {shown or 'no leaf, but an op'}",
        *problems,
    ]
    d = recorder.differs
    if d is None:
        kept = (
            " (the first run's ops were too large to keep them all)"
            if recorder.full
            else ""
        )
        lines.append(f"  every op gave the same outputs twice{kept}")
        return lines, None
    site = d.site
    layer = f"layer {site.module} ({site.kind})" if site.module else "no module"
    call = "the backward of the call at " if site.phase == "backward" else "called at "
    lines += [
        f"  first op whose outputs differ between the runs, from the same inputs: "
        f"{d.op} (op {d.index + 1} of {ops}, {site.phase}) in {layer}, "
        f"{call}{site.line}",
        *(f"    {text}" for text in d.inputs),
        f"    {d.output}: {d.diff.mismatched}/{d.diff.numel} elements differ, "
        f"worst at {_index(d.diff.worst)}: first run {d.cpu_value:.6g}, second "
        f"{d.device_value:.6g} (|diff| {d.diff.max_abs:.2e})",
    ]
    return lines, d


@contextlib.contextmanager
def _deterministic(target: torch.device) -> Iterator[None]:
    """On CUDA, PyTorch's deterministic kernels for both runs.

    CUDA's documented nondeterministic kernels (atomics: ``max_pool2d``'s and
    ``index_add``'s backward, cuDNN's convolution algorithms) answer
    differently from run to run by design, and the first of them would be
    named in place of an op that drifts when it should not (pytorch#180776's
    ``F.linear`` on MPS). ``warn_only``: an op without a deterministic kernel
    still runs (its warning is left out); everything is put back after.
    """
    import torch

    if target.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic,
        cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "(?s).*does not have a deterministic")
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark = before[2], before[3]


def _index(index: tuple[int, ...] | None) -> str:
    return "()" if not index else "(" + ", ".join(map(str, index)) + ")"


def assert_reproducible(
    fn_or_module: Any,
    *inputs: Any,
    device: str | torch.device,
    grads: bool = True,
    steps: int = 0,
    rtol: float = 0.0,
    atol: float = 0.0,
    train: bool | None = None,
    optimizer: Callable[[list[Any]], Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> None:
    """Assert that ``fn_or_module(*inputs)`` gives the same twice on ``device``.

    Both runs are made as :func:`assert_device_parity` makes its device side
    (copies of the module and inputs, seeded with ``seed``, forward, the
    backward of fixed weights on the outputs, ``steps`` optimizer steps), on
    the one device. Every output, gradient, parameter after the steps and
    buffer must agree, bit for bit by default (``rtol``/``atol`` allow
    more). On CUDA both runs use PyTorch's deterministic kernels
    (``torch.use_deterministic_algorithms(True, warn_only=True)``, cuDNN's
    deterministic algorithms), put back after: its documented atomics are
    not what this check looks for. On a difference the
    :class:`NotReproducible` error names the leaves and the first aten op
    whose outputs differ between the runs from the same inputs, with its
    layer, the user's line, its inputs and the worst element.
    """
    __tracebackhide__ = True

    where = "assert_reproducible"
    frame = inspect.currentframe()
    names = argument_names(frame.f_back if frame else None, where, 1 + len(inputs))
    validate(where, fn_or_module, steps, grads, (rtol, atol), None, train, kwargs)
    target = device_named(where, device, "device")
    plan = make_plan(
        fn_or_module, names, inputs, kwargs, train=train, grads=grads,
        steps=steps, optimizer=optimizer, seed=seed,
    )  # fmt: skip
    lines, differs = twice(where, plan, target, (float(rtol), float(atol)))
    if lines:
        raise NotReproducible("\n".join(lines), differs)
