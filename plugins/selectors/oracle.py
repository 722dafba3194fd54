"""Oracle: correct when any candidate is. A ceiling: it reads labels and is never ranked."""

from __future__ import annotations

from collections.abc import Sequence

from dllmbench.api.hookspecs import hookimpl
from dllmbench.core.types import Candidate


class Oracle:
    """A ceiling: a correct candidate whenever the pool holds one (it reads the labels)."""

    needs: tuple[str, ...] = ()
    ceiling = True
    config = None

    def select(self, candidates: Sequence[Candidate], *, rng, labels=None) -> int | None:
        if labels is None:
            raise ValueError("oracle is a ceiling and needs labels")
        if not candidates:
            return None
        return next((i for i, ok in enumerate(labels) if ok), 0)


@hookimpl
def dllmbench_register_selectors(register):
    register("oracle", Oracle)
