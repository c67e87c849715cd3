"""A GPT trained from scratch in the spirit of nanoGPT, on MPS, CUDA or CPU."""

__version__ = "0.1.0"
