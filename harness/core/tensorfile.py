"""Safetensors files written as any file the user writes is: readable by whom the umask allows.

safetensors (0.8) creates its files owner-only (0600) whatever the umask, so a trained scorer
or a collection written on a shared machine could not be read by the team it was made for.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def umask() -> int:
    """The process's file-mode creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """`safetensors.torch.save_file`, the file then given the mode `open` would give it."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    os.chmod(path, 0o666 & ~umask())
