"""An emulated MPS device: a Mac's failures, reproduced on any machine.

The family, lowest first: :mod:`.policy` (what MPS does with an op, its
tensors and its generator, in PyTorch's words, from the audit's op table and
rules), :mod:`.memory` (the emulated Mac's memory limit and PyTorch's
out-of-memory error), :mod:`.tensor` (the emulated tensor and generator),
:mod:`.calls` (the session's torch-function mode: device arguments, autocast,
the user's call),
:mod:`.serialization` (``torch.save``/``torch.load`` as on a Mac),
:mod:`.install` (putting it all into torch and taking it out), and
:mod:`.plugin`, the front door (``--mps-emulate``).
"""

from __future__ import annotations
