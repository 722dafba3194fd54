"""`dllmbench diagnose`: the paper's scorer controls, run on a collection's stored states.

`run_controls` loads a collection (`collect.load`), builds each scorer on the collection's
backbone, scores every stored state (a scorer that reads only final states scores the fully
decoded ones) and the inputs the controls change:

- the suffix ablation: the right half of the generated region set to the mask token (every
  scorer that reads partial states; its mask ratio is read from the changed canvas);
- reversed input: the solution (the generated tokens before the first stop token) reversed,
  the prompt and what follows the solution kept (every causal scorer, `settings["attention"]`);

then hands the scores to `analysis.controls` and returns the content of controls.json
(`schema.Controls`). Readout pairs are scorers whose settings differ only in `pooling`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dllmbench.analysis import controls as c
from dllmbench.analysis.controls_slicing import slicing_entries
from dllmbench.analysis.diagnostics import scorer_swap
from dllmbench.analysis.pooled import PooledCandidate
from dllmbench.analysis.report_sections import DIGITS, interval, rounded
from dllmbench.analysis.stats import CONFIDENCE, RESAMPLES, median_interval
from dllmbench.api.interfaces import ScoreBatch
from dllmbench.core.errors import UserError
from dllmbench.core.schema import CONTROLS_SCHEMA_VERSION, Controls
from dllmbench.loading.registry import Registry
from dllmbench.running.runner import plugin_entry
from dllmbench.scoring.collect import Snapshot, load, mask_ratios

BATCH = 256  # rows per call into a scorer


@dataclass(frozen=True)
class ControlsConfig:
    """The settings of `dllmbench diagnose`."""

    width: int = 8  # K: trajectories per group of the removal-risk counterfactual (the paper's)
    seed: int = 0  # of the bootstrap
    resamples: int = RESAMPLES
    level: float = CONFIDENCE

    @property
    def boot(self) -> c.Boot:
        return c.Boot(self.seed, self.resamples, self.level)


# -- the inputs the controls change ----------------------------------------------------------


def suffix_ablated(tokens: torch.Tensor, prompt_len: int, mask_id: int) -> torch.Tensor:
    """The right half of the generated region (positions from prompt_len + ⌈G/2⌉ on, for G
    generated positions) set to the mask token."""
    out = tokens.clone()
    generated = tokens.numel() - prompt_len
    out[prompt_len + (generated + 1) // 2 :] = mask_id
    return out


def reversed_solution(tokens: torch.Tensor, prompt_len: int, stops: set[int]) -> torch.Tensor:
    """The solution (generated tokens before the first stop token) in reverse order; the
    prompt and everything from the first stop token on stay in place."""
    out = tokens.clone()
    generated = tokens[prompt_len:].tolist()
    end = next((i for i, t in enumerate(generated) if t in stops), len(generated))
    out[prompt_len : prompt_len + end] = tokens[prompt_len : prompt_len + end].flip(0)
    return out


# -- scoring ----------------------------------------------------------------------------------


def score_states(
    scorer: Any,
    tokens: list[torch.Tensor],
    prompt_lens: list[int],
    steps: list[int],
    total: int,
    advance: Callable[[int], None] | None = None,
) -> np.ndarray:
    """The scorer's score of each state, BATCH rows per call."""
    out = np.empty(len(tokens))
    for start in range(0, len(tokens), BATCH):
        end = min(start + BATCH, len(tokens))
        batch = ScoreBatch(tokens[start:end], prompt_lens[start:end], steps[start:end], total)
        values = np.asarray(scorer.score(batch), dtype=np.float64)
        if values.shape != (end - start,) or not np.isfinite(values).all():
            raise UserError(
                f"scorer {type(scorer).__name__} returned {values.shape} scores for "
                f"{end - start} states, or a score that is not finite"
            )
        out[start:end] = values
        if advance:
            advance(end - start)
    return out


def snapshot_arrays(
    meta: dict[str, Any], states: list[Snapshot], mask_id: int
) -> tuple[c.Snapshots, list[str]]:
    """The collection's states as `controls.Snapshots`, and the problem ids in order."""
    problems = list(dict.fromkeys(s.problem for s in states))
    index = {p: i for i, p in enumerate(problems)}
    snaps = c.Snapshots(
        problem=np.array([index[s.problem] for s in states], np.int64),
        trajectory=np.array([s.index for s in states], np.int64),
        step=np.array([s.step for s in states], np.int64),
        mask_ratio=np.clip(mask_ratios(states, mask_id), 0.0, 1.0),
        final=np.array([s.final for s in states], bool),
        label=np.array([s.correct for s in states], bool),
    )
    return snaps, problems


def settings_of(scorer: Any) -> dict[str, Any]:
    """A scorer's resolved settings (attention, pooling, …), {} when it has none."""
    found = getattr(scorer, "settings", None)
    return dict(found) if isinstance(found, Mapping) else {}


def readout_pairs(settings: Mapping[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs (mean, last) of scorers whose settings differ only in `pooling`."""
    pairs = []
    names = sorted(settings)
    for a in names:
        for b in names:
            sa, sb = settings[a], settings[b]
            if not sa or sa.get("pooling") != "mean" or sb.get("pooling") != "last":
                continue
            rest = {k: v for k, v in sa.items() if k != "pooling"}
            if rest == {k: v for k, v in sb.items() if k != "pooling"}:
                pairs.append((a, b))
    return pairs


def run_controls(
    path: Path,
    scorer_specs: Mapping[str, tuple[str, dict[str, Any]]],
    reg: Registry,
    cfg: ControlsConfig,
    *,
    backbone_override: tuple[str, dict[str, Any]] | None = None,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
) -> Controls:
    """Score the collection at `path` with each scorer and compute every control."""
    boot = cfg.boot
    meta, states = load(path)
    if not states:
        raise UserError(f"{path} holds no trajectories yet; finish it with dllmbench collect")
    if backbone_override is not None:
        backbone_name, backbone_config = backbone_override
    else:
        backbone_name = meta["backbone"]["name"]
        backbone_config = dict(meta["backbone"]["config"])
    for plugin, config in scorer_specs.values():
        reg.check("scorer", plugin, **config)  # a typo costs no model load
    backbone = reg.backbone(backbone_name, **backbone_config)
    total = int(meta["sampling"]["total_steps"])
    snaps, problems = snapshot_arrays(meta, states, backbone.mask_id)
    if int(meta["n"]) < 2:
        raise UserError(f"{path} has one trajectory per problem; collect with --n 2 or more")
    if snaps.label.all() or not snaps.label.any():  # AUCs need both, before any scoring
        outcome = "correct" if snaps.label.all() else "wrong"
        raise UserError(
            f"every trajectory in {path} ends {outcome}: the controls need correct and wrong "
            "ones; collect more problems (--limit) or more trajectories per problem (--n)"
        )
    tokens = [s.tokens for s in states]
    plens = [s.prompt_len for s in states]
    steps = [s.step for s in states]
    final_idx = np.flatnonzero(snaps.final)
    stops = set(getattr(backbone, "stop_ids", ()) or ())

    scores: dict[str, np.ndarray] = {}
    variants: dict[str, dict[str, np.ndarray]] = {"suffix": {}, "reversed": {}}
    settings: dict[str, dict[str, Any]] = {}
    entries: dict[str, Any] = {}
    partial: dict[str, bool] = {}
    for name, (plugin, config) in scorer_specs.items():
        scorer = reg.scorer(plugin, shared={"backbone": backbone}, **config)
        entries[name] = plugin_entry(reg, "scorer", plugin, scorer)
        settings[name] = settings_of(scorer)
        partial[name] = bool(getattr(scorer, "reads_partial", True))
        rows = np.arange(len(states)) if partial[name] else final_idx
        causal = settings[name].get("attention") == "causal"
        todo = len(rows) * (1 + partial[name] + causal)
        advance = progress(name, todo) if progress else None

        def score(
            changed: list[torch.Tensor],
            rows: np.ndarray = rows,
            scorer: Any = scorer,
            advance: Callable[[int], None] | None = advance,
        ) -> np.ndarray:
            full = np.full(len(states), np.nan)
            full[rows] = score_states(
                scorer,
                changed,
                [plens[i] for i in rows],
                [steps[i] for i in rows],
                total,
                advance,
            )
            return full

        scores[name] = score([tokens[i] for i in rows])
        if partial[name]:
            ablated = [suffix_ablated(tokens[i], plens[i], backbone.mask_id) for i in rows]
            variants["suffix"][name] = score(ablated)
        if causal:
            flipped = [reversed_solution(tokens[i], plens[i], stops) for i in rows]
            variants["reversed"][name] = score(flipped)

    out: dict[str, Any] = {
        "schema_version": CONTROLS_SCHEMA_VERSION,
        "collection": {
            "path": str(path),
            "task": meta["task"],
            "backbone": meta["backbone"],
            "sampling": meta["sampling"],
            "n": int(meta["n"]),
            "snapshot_steps": meta["snapshot_steps"],
            "problems": len(problems),
            "states": len(states),
            "correct": round(float(snaps.label[snaps.final].mean()), DIGITS),
        },
        "backbone_weights": plugin_entry(reg, "backbone", backbone_name, backbone).get("weights"),
        "scorers": entries,
        "seed": boot.seed,
        "resamples": boot.resamples,
        "level": boot.level,
        "width": min(cfg.width, int(meta["n"])),
    }
    out.update(_controls(snaps, scores, variants, settings, partial, total, boot, out["width"]))
    return Controls(**out)


def _controls(
    snaps: c.Snapshots,
    scores: dict[str, np.ndarray],
    variants: dict[str, dict[str, np.ndarray]],
    settings: dict[str, dict[str, Any]],
    partial: dict[str, bool],
    total: int,
    boot: c.Boot,
    width: int,
) -> dict[str, Any]:
    tau_rows, rerank_rows = [], []
    for name, s in scores.items():
        tau = c.kendall_final(snaps, np.nan_to_num(s))
        defined = [t for t in tau.per_problem.values() if not np.isnan(t)]
        spread = median_interval(
            defined, resamples=boot.resamples, level=boot.level, seed=boot.seed
        )
        tau_rows.append(
            {
                "scorer": name,
                "median": rounded(tau.median),
                "interval": interval(spread),
                "mean": rounded(tau.mean),
                "problems": tau.problems,
                "undefined": tau.undefined,
            }
        )
        ranked = c.reranker(snaps, np.nan_to_num(s), boot)
        rerank_rows.append(
            {
                "scorer": name,
                "mean_correct": rounded(ranked.mean_correct),
                "mean_incorrect": rounded(ranked.mean_incorrect),
                "separated": rounded(ranked.separated),
                "mixed": ranked.mixed,
                "points": [
                    {
                        "n": p.n,
                        "scorer": interval(p.scorer),
                        "random": interval(p.random),
                        "difference": interval(p.difference),
                    }
                    for p in ranked.points
                ],
            }
        )
    sliced = {name: s for name, s in scores.items() if partial[name]}
    return {
        **slicing_entries(snaps, sliced, total, boot, width),
        "kendall_tau": tau_rows,
        "readout": _readout(snaps, scores, settings, boot),
        "suffix_ablation": [
            {"scorer": name, **_change(c.auc_change(snaps, scores[name], ablated, boot))}
            for name, ablated in variants["suffix"].items()
        ],
        "reversed_input": _reversed(snaps, scores, variants["reversed"], settings, boot),
        "reranker": rerank_rows,
        "scorer_swap": _swap(snaps, scores, boot),
    }


def _change(change: c.AUCChange, a: str = "original", b: str = "ablated") -> dict[str, Any]:
    return {
        "n": change.n,
        a: interval(change.a),
        b: interval(change.b),
        "change": interval(change.change),
    }


def _readout(
    snaps: c.Snapshots,
    scores: dict[str, np.ndarray],
    settings: dict[str, dict[str, Any]],
    boot: c.Boot,
) -> list[dict[str, Any]]:
    """Final-state ROC-AUC of each (mean, last-token) pair and the change mean → last."""
    out = []
    for mean, last in readout_pairs(settings):
        change = c.auc_change(snaps, scores[mean], scores[last], boot, where=snaps.final)
        out.append(
            {
                "mean": mean,
                "last": last,
                "attention": settings[mean].get("attention"),
                **_change(change, "mean_auc", "last_auc"),
            }
        )
    return out


def _reversed(
    snaps: c.Snapshots,
    scores: dict[str, np.ndarray],
    flipped: dict[str, np.ndarray],
    settings: dict[str, dict[str, Any]],
    boot: c.Boot,
) -> list[dict[str, Any]]:
    """Each causal scorer on forward and reversed input and on their average (over every
    state it scored), and the gap of the average to a bidirectional scorer of the same kind
    and readout on the same states, if one was given."""
    out = []
    for name, backward in flipped.items():
        where = ~np.isnan(scores[name])
        averaged = (scores[name] + backward) / 2.0
        forward_vs_back = c.auc_change(snaps, scores[name], backward, boot, where=where)
        forward_vs_avg = c.auc_change(snaps, scores[name], averaged, boot, where=where)
        entry: dict[str, Any] = {
            "scorer": name,
            "n": forward_vs_back.n,
            "forward": interval(forward_vs_back.a),
            "reversed": interval(forward_vs_back.b),
            "averaged": interval(forward_vs_avg.b),
            "reference": None,
        }
        for other, s in sorted(settings.items()):
            mine = {k: v for k, v in settings[name].items() if k != "attention"}
            if s.get("attention") == "bidirectional" and mine == {
                k: v for k, v in s.items() if k != "attention"
            }:
                gap = c.auc_change(snaps, scores[other], averaged, boot, where=where)
                entry["reference"] = {
                    "scorer": other,
                    "auc": interval(gap.a),
                    "gap": interval(gap.change),
                }
                break
        out.append(entry)
    return out


def _swap(snaps: c.Snapshots, scores: dict[str, np.ndarray], boot: c.Boot) -> dict[str, Any]:
    """Every scorer reranking the same pools of fully decoded states, and a uniform pick."""
    pools = [
        [PooledCandidate(None, correct, scored) for scored, correct in pool]
        for pool in c.scorer_pools(snaps, {n: np.nan_to_num(s) for n, s in scores.items()})
    ]
    opts = {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed}
    swap = scorer_swap(pools, list(scores), **opts)
    return {
        "size": min(len(p) for p in pools),
        "accuracy": {name: interval(ci) for name, ci in swap.accuracy.items()},
        "differences": [
            {"a": a, "b": b, **interval(ci)} for (a, b), ci in swap.differences.items()
        ],
    }


def write(out: Path, controls: Controls, markdown: str) -> tuple[str, ...]:
    """controls.json and controls.md into `out`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "controls.json").write_text(
            json.dumps(controls, indent=2, allow_nan=False) + "\n", encoding="utf-8"
        )
        (out / "controls.md").write_text(markdown, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write to {out} ({exc.strerror}); choose another --out") from exc
    return ("controls.json", "controls.md")
