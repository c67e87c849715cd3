"""Shared test setup.

pytester's in-process runs restore ``sys.modules`` afterwards; a torch first
imported inside such a run would be dropped and imported again by the next one,
which crashes the interpreter. Importing it once here keeps it loaded.
"""

import torch  # noqa: F401
