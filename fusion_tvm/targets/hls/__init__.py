"""The HLS (FPGA) backend: fused groups as a Vitis-HLS-style dataflow C++ project."""

from .backend import HLSBackend, HLSModel

__all__ = ["HLSBackend", "HLSModel"]
