"""Prophet: early answer commitment (Li et al., "Diffusion Language Models Know the Answer
Before Decoding", arXiv 2508.19982, ICLR 2026; code pixeli99/Prophet) as a search strategy: n
samples under the sampler's early-exit rule, then any selector.

Each row carries the sampler settings of Prophet's rule (docs/backbones.md, "Prophet's early
exit"): after every step's forward, the mean gap between the top-1 and top-2 logits over the
answer region (`answer_length` generated positions from `answer_at`) is compared with its
phase's bar (`early` while (s + 1)/T < 0.33, `mid` below 0.67, `late` after); once it reaches
it, every masked position takes the step's draw and the row ends, charged the steps it took:
the cost n·T is a cap. `constraints` ("20:The|21:answer|22:is", the reference's
`constraints_text`) are tokens the sampler holds in the canvas from the start; the answer
region then starts 2 after the last of them unless `answer_at` says. `exit=false` is the
paper's baseline: the same constraints, no early exit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from dllmbench.api.hookspecs import hookimpl
from dllmbench.api.interfaces import Evidence
from dllmbench.api.ops import Ops
from dllmbench.plugins.strategies.independent import Independent


@dataclass(frozen=True)
class ProphetConfig:
    n: int = 1  # samples
    answer_at: int | None = None  # the answer region's first generated position
    answer_length: int = 5  # its length (the reference's 5)
    early: float = 7.5  # the mean top-2 logit gap that ends a row while (s + 1)/T < 0.33
    mid: float = 5.0  # ... below 0.67
    late: float = 2.5  # ... after
    constraints: str = ""  # tokens held from the start: "20:The|21:answer|22:is"
    exit: bool = True  # false: the same constraints, no early exit (the paper's baseline)

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        for name in ("early", "mid", "late"):
            bar = getattr(self, name)
            number = isinstance(bar, (int, float)) and not isinstance(bar, bool)
            if not (number and math.isfinite(bar) and bar >= 0):
                raise ValueError(
                    f"{name} must be a finite number >= 0 (a mean top-2 logit gap, e.g. 7.5), "
                    f"got {bar!r}"
                )
        if not isinstance(self.exit, bool):
            raise ValueError(f"exit must be true or false, got {self.exit!r}")
        if self.exit and self.answer_at is None and not self.constraints:
            raise ValueError(
                "prophet needs its answer region: answer_at=<generated position> (e.g. "
                "answer_at=20), or constraints=position:word|... (e.g. 20:The|21:answer|22:is) "
                "that it starts 2 after"
            )
        if not isinstance(self.constraints, str):
            raise ValueError(
                f"constraints must be position:word pairs like 20:The|21:answer, got "
                f"{self.constraints!r}"
            )


class Prophet(Independent):
    """n samples, each ending as soon as its answer region is confidently decided."""

    Config = ProphetConfig
    capped: ClassVar[bool] = True  # rows end early, charged the steps they took
    cost_formula: ClassVar[str] = "denoise: ≤ n·T"
    contract_configs: ClassVar[list[dict]] = [
        {"n": 1, "answer_at": 3},
        {"n": 3, "answer_at": 2, "answer_length": 2, "early": 0.5, "mid": 0.2, "late": 0.1},
        {"n": 2, "constraints": "1:1|2:+", "answer_length": 2, "late": 0.0},
        {"n": 2, "constraints": "1:1", "exit": False},
    ]

    def evidence(self) -> Evidence:
        return Evidence(nested="n")  # nested, but not at the run's own sampler settings

    def sets_per_row(self) -> frozenset[str]:
        return frozenset(self.settings_by_config()[0])

    def settings_by_config(self) -> list[dict[str, Any]]:
        """The settings every row takes (`SettingsByConfig`): checked against the backbone's
        Config before the model loads."""
        c = self.config
        settings: dict[str, Any] = {}
        if c.constraints:
            settings["constraints"] = c.constraints
        if not c.exit:
            return [settings]
        settings.update(
            prophet=True,
            answer_length=c.answer_length,
            early_gap=c.early,
            mid_gap=c.mid,
            late_gap=c.late,
        )
        if c.answer_at is not None:
            settings["answer_at"] = c.answer_at
        return [settings]

    def settings(self, ops: Ops) -> list[dict[str, Any]] | None:
        settings = self.settings_by_config()[0]
        return [settings] * self.config.n if settings else None


@hookimpl
def dllmbench_register_strategies(register):
    register("prophet", Prophet)
