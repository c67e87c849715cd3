"""Which machine ran it: the fingerprint, virtual GPUs, and MPS memory limits.

- :mod:`.fingerprint`: OS name, version and build, chip, GPU, Metal and
  MPSGraph versions, virtual or not, the memory limits, torch's version and
  build; one line for the header, a dict for the JSON files, the fields two
  runs differ in.
- :mod:`.virtual`: a paravirtual GPU (hosted macOS runners) recognised, and
  what the run does on one (``--mps-virtual-gpu``); the MPS cache emptied after
  each test on small-memory devices (``--mps-empty-cache``).
- :mod:`.plugin`: the options, the header line and the junit properties.

Everything macOS-only is read through :mod:`pytest_mps.backend` (the shim).
"""
