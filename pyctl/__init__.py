"""pyctl: a NUMA- and MIG-aware GPU fragmentation controller for Kubernetes inference clusters."""

from importlib import metadata

try:
    __version__ = metadata.version("pyctl")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
