"""Deterministic ranking shared by the guided strategies."""

from __future__ import annotations

import numpy as np


def top(scores: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m highest scores, descending; ties go to the lower index."""
    scores = np.asarray(scores, dtype=np.float64)
    if np.isnan(scores).any():
        raise ValueError("a scorer returned NaN")
    return np.argsort(-scores, kind="stable")[:m]
