"""pyctl: a NUMA- and MIG-aware GPU fragmentation controller for Kubernetes inference clusters."""

from pyctl._core import __version__

__all__ = ["__version__"]
