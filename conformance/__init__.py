"""remat-conformance: differential testing of rematerialization in JAX and PyTorch."""
__version__ = "0.1.0"
