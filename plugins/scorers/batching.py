"""Scoring a row the same whatever rows share its forward.

A float32 forward's reductions run over the padded width of its batch, so a row's score moves
in its last bits with its neighbours (up to 1e-5 on the demo's scorers): enough for a search
that prunes on near-equal scores to decide by its batch. Scorers therefore pad each row to its
own length rounded up to `WIDTH_STEP` and run the rows of one width together: a row's score
then depends on the row alone, but for the matrix products' rounding with the batch's size
(1e-7 on the demo's scorers, against 1e-5 when rows were padded to the widest of their batch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

WIDTH_STEP = 16  # rows are padded to a multiple of this many tokens


def by_width(rows: Sequence[torch.Tensor]) -> Iterator[tuple[int, list[int]]]:
    """(width, indices of the rows padded to it), widths ascending."""
    widths = [-(-len(row) // WIDTH_STEP) * WIDTH_STEP for row in rows]
    for width in sorted(set(widths)):
        yield width, [i for i, w in enumerate(widths) if w == width]


def pad_to(backbone, rows: Sequence[torch.Tensor], width: int, pad_id: int):
    """The backbone's left padding of `rows` ([B, L] ids, attention mask, left offsets),
    widened on the left to `width`."""
    ids, attn, offsets = backbone.pad(list(rows))
    extra = width - ids.shape[1]
    if extra > 0:
        ids = torch.cat([torch.full((len(rows), extra), pad_id, dtype=ids.dtype), ids], dim=1)
        attn = torch.cat([torch.zeros((len(rows), extra), dtype=attn.dtype), attn], dim=1)
        offsets = [o + extra for o in offsets]
    return ids, attn, offsets


def pad_id_of(backbone) -> int:
    """The token the backbone pads with."""
    one = torch.tensor([backbone.mask_id])
    return int(backbone.pad([one, one.repeat(2)])[0][0, 0])
