"""The two snapshot slicings of the scorer controls, as controls.json holds them, and the one
`dllmbench report --controls DIR --slicing` puts in front.

ROC-AUC by mask ratio and the removal-risk counterfactual depend on how the stored states are
sliced (`analysis.controls.SLICINGS`):

- `paper`, the paper's: every stored state in the mask-ratio buckets, from the all-mask canvas
  (step 0, in [0.9, 1.0]) to the fully decoded state (in [0, 0.1)); the removal risk's
  initial state is the all-mask canvas;
- `split`, the project's earlier slicing: the states at steps 0 < s < T in the buckets, the
  fully decoded states only apart; the initial state is the first stored step after 0.

Both give the fully decoded states alone too (`final`). controls.json holds the paper's in
`auc_by_mask` and `removal_risk` (`slicing`: "paper") and the other in `alternative`
(`slicing`, `auc_by_mask`, `removal_risk`); `select_slicing` swaps the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dllmbench.analysis import controls as c
from dllmbench.analysis.report_sections import DIGITS, bucket_entry, interval
from dllmbench.core.errors import UserError
from dllmbench.core.schema import Controls

SLICED = ("auc_by_mask", "removal_risk")  # the keys of controls.json a slicing changes


def risk_entry(scorer: str, r: c.RemovalRisk) -> dict[str, Any]:
    """One removal-risk row of controls.json."""
    return {
        "scorer": scorer,
        "state": r.state,
        "step": r.step,
        "mask_ratio": round(r.mask_ratio, DIGITS),
        "keep": r.keep,
        "width": r.width,
        "groups": r.groups,
        "at_risk": r.at_risk,
        "lost": r.lost,
        "rate": interval(r.rate),
        "rate_all_groups": interval(r.rate_all_groups),
    }


def sliced_entries(
    snaps: c.Snapshots,
    scores: Mapping[str, np.ndarray],
    total: int,
    boot: c.Boot,
    width: int,
    slicing: str,
) -> dict[str, Any]:
    """`slicing`, `auc_by_mask` and `removal_risk` of the scorers of partial states
    (`scores`) under one slicing."""
    auc_rows, risk_rows = [], []
    for name, s in scores.items():
        curve = c.auc_by_mask(snaps, s, boot, slicing)
        auc_rows.append(
            {
                "scorer": name,
                "buckets": [bucket_entry(b) for b in curve.buckets],
                "final": bucket_entry(curve.final),
            }
        )
        risks = c.removal_risk(snaps, s, total, boot, width=width, slicing=slicing)
        risk_rows += [risk_entry(name, r) for r in risks]
    return {"slicing": slicing, "auc_by_mask": auc_rows, "removal_risk": risk_rows}


def slicing_entries(
    snaps: c.Snapshots,
    scores: Mapping[str, np.ndarray],
    total: int,
    boot: c.Boot,
    width: int,
) -> dict[str, Any]:
    """What controls.json holds of the sliced controls: the paper's slicing in front
    (`slicing`, `auc_by_mask`, `removal_risk`) and the project's in `alternative`."""
    front, other = (sliced_entries(snaps, scores, total, boot, width, s) for s in c.SLICINGS)
    return {**front, "alternative": other}


def select_slicing(controls: Controls, slicing: str, source: str | Path) -> Controls:
    """`controls` with `slicing`'s sliced controls in front and the other slicing's in
    `alternative`; one line refusing controls (read from the folder `source`) that hold one
    slicing only, written before both were."""
    if slicing not in c.SLICINGS:
        raise UserError(f"--slicing must be one of {', '.join(c.SLICINGS)}, got {slicing!r}")
    found: dict[str, Any] = dict(controls)
    other = found.get("alternative")
    if "slicing" not in found or not isinstance(other, dict):
        raise UserError(
            f"the controls in {source} hold one snapshot slicing only (controls.json schema "
            f"{found.get('schema_version')}); make them again with dllmbench diagnose"
        )
    if found["slicing"] == slicing:
        return controls
    front = {key: found[key] for key in ("slicing", *SLICED)}
    found.update({key: other[key] for key in ("slicing", *SLICED)}, alternative=front)
    return Controls(**found)
