"""dllmbench: which way of spending test-time search on a diffusion LM wins at equal compute."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dllmbench")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
