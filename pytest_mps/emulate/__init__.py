"""An emulated MPS device: a Mac's failures, reproduced on any machine.

The family, lowest first: :mod:`.messages` (PyTorch's texts, and
``NotEmulatedError``), :mod:`.policy` (what MPS does with an op, its tensors
and its generator, in PyTorch's words, from :mod:`pytest_mps.ops` and the
audit's rules), :mod:`.memory` (the emulated Mac's memory limit and PyTorch's
out-of-memory error), :mod:`.tags` (which storages are on the device),
:mod:`.patching` (attributes replaced while installed, and import hooks),
:mod:`.host` (``platform`` answering as an Apple-silicon Mac), :mod:`.widen`
(dtypes only the MPS kernel has, computed wider), :mod:`.refused` (what a
device call the CPU refused becomes), :mod:`.op_rules` (per-op rules at the
dispatcher's BackendSelect key), :mod:`.backward` (Python run by autograd sees
the device), :mod:`.tagged` (the function mode: tagged CPU tensors that act as
MPS tensors), :mod:`.scripts` (TorchScript's outputs tagged, as it runs below
the mode), :mod:`.explain` (``torch._dynamo.explain`` traced outside the
mode), :mod:`.extensions` (C++ extensions built against MPS, named not
emulated), :mod:`.serialization` (``torch.save``/``torch.load`` as on a Mac),
:mod:`.install` (putting it all into torch and taking it out),
:mod:`.failures` (how a failure reads: the user's line and PyTorch's
message),
:mod:`.plugin`, the front door (``--mps-emulate``), and :mod:`.hooks`, which
it registers once the emulation is on.
"""

from __future__ import annotations
