"""Common random numbers: every random draw is keyed, never taken from global state.

A row's key comes from (run seed, problem id, sampling stream, lineage path); the noise of
that row at step t comes from a generator seeded by (key, t). Nothing depends on batch
position, batch size or which other methods share the run.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and torch load when a generator is made, not with the module
    import numpy as np
    import torch

_MASK63 = (1 << 63) - 1


def _hash(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def row_key(seed: int, problem_id: str, stream: str, lineage: tuple[int, ...]) -> int:
    """The 63-bit key of one row."""
    return _hash("row", int(seed), str(problem_id), str(stream), tuple(int(i) for i in lineage))


def step_seed(key: int, step: int) -> int:
    """Seed of the noise a row with `key` draws at denoising step `step`."""
    return _hash("step", int(key), int(step))


def torch_generator(key: int, step: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator for one row at one step."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(step_seed(key, step))
    return gen


def numpy_rng(*parts: object) -> np.random.Generator:
    """A numpy generator keyed by any tuple of labels (resampling, random selection, ...)."""
    import numpy as np

    return np.random.default_rng(_hash("numpy", *parts))
