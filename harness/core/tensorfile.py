"""Safetensors files written as any file the user writes is: readable by whom the umask allows.

safetensors (0.8) creates its files owner-only (0600) whatever the umask, so a trained scorer
or a collection written on a shared machine could not be read by the team it was made for.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def umask() -> int:
    """The process's file-mode creation mask: Linux's /proc/self/status says it; elsewhere it
    is read by setting it and setting it back (a file another thread creates in between
    would get 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """`safetensors.torch.save_file`, the file then given the mode `open` would give it."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    os.chmod(path, 0o666 & ~umask())
