"""Training a scorer on collected trajectories: `dllmbench train-scorer`.

Works with any scorer plugin that can be trained, a `dllmbench.interfaces.TrainableScorer`:
`trainable()` (its parameters), a differentiable `logits(tokens, prompt_lens)`,
`train_mode(flag)`, `save(path, extra)` and `load_weights(path)`. A PRM learns from every
snapshot, an ORM from final states only; each is labelled with its trajectory's final
correctness (`labels="final"`), or, on a collection with rollouts (`labels="rollout"`), with
the share of its R rollouts that reached a correct answer (a final state keeps its 0/1);
BCE either way, on fractional targets for rollouts (`targets()`). AdamW, a cosine schedule
with optional warmup, gradient clipping and accumulation. Validation uses held-out *training*
problems: BCE, accuracy and ROC-AUC overall and per mask-ratio bucket, against the final
correctness whatever the labels; on a collection with rollouts also `rollout_bce`, the mean
BCE against the rollout shares. The checkpoint with the lowest validation BCE (against the
final correctness) is kept as `best/`.
`latest/` holds everything needed to resume exactly. `train()` runs `select_data()`, then
`train_step()` until the last step, with `validate()` and `save_checkpoint()` every
`val_every` steps; `resume()` picks up `latest/`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dllmbench.api.interfaces import TrainableScorer
from dllmbench.core.errors import UserError
from dllmbench.scoring.collect import Snapshot, mask_ratios


@dataclass(frozen=True)
class TrainConfig:
    kind: str  # "prm": every snapshot; "orm": final states only
    steps: int = 2000
    batch: int = 32
    accum: int = 1
    lr: float = 2e-5
    warmup: int = 0
    weight_decay: float = 0.01
    clip: float = 1.0
    val_fraction: float = 0.1
    val_every: int = 200
    max_val: int = 4000
    # "mixed": only problems whose trajectories disagree; "balanced": of those, as many
    # correct as incorrect final states per problem (drawn with the seed)
    groups: str = "all"
    seed: int = 0
    # "final": every snapshot's target is its trajectory's final correctness (0/1);
    # "rollout": the share of its R rollouts that were correct (a collection with rollouts)
    labels: str = "final"

    def __post_init__(self) -> None:
        if self.kind not in ("prm", "orm"):
            raise ValueError(f"kind must be 'prm' or 'orm', got {self.kind!r}")
        if self.labels not in ("final", "rollout"):
            raise ValueError(f"labels must be 'final' or 'rollout', got {self.labels!r}")
        if self.groups not in ("all", "mixed", "balanced"):
            raise ValueError(f"groups must be 'all', 'mixed' or 'balanced', got {self.groups!r}")


def warmup_cosine(total: int, warmup: int) -> Callable[[int], float]:
    """Learning-rate factor: linear warmup over `warmup` steps, then cosine decay to 0."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))

    return factor


def split_problems(snapshots: list[Snapshot], fraction: float, seed: int) -> set[str]:
    """Validation problems: a seeded shuffle of the sorted ids, `fraction` of them (>= 1)."""
    ids = sorted({s.problem for s in snapshots})
    if len(ids) < 2:
        raise UserError("training a scorer needs trajectories of at least 2 problems")
    random.Random(seed).shuffle(ids)
    return set(ids[: max(1, round(fraction * len(ids)))])


def auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score  # imported here: only training needs it

    return float(roc_auc_score(labels, scores)) if 0 < labels.sum() < len(labels) else None


def mixed_problems(snapshots: list[Snapshot]) -> set[str]:
    """Problems with both a correct and an incorrect trajectory."""
    outcomes: dict[str, set[bool]] = {}
    for s in snapshots:
        outcomes.setdefault(s.problem, set()).add(s.correct)
    return {p for p, seen in outcomes.items() if len(seen) == 2}


def balance(snapshots: list[Snapshot], seed: int) -> list[Snapshot]:
    """Per problem, as many trajectories ending correct as ending wrong: the smaller side
    whole, the same number drawn from the larger. Every snapshot of a kept trajectory stays.
    With each problem at a 50% base rate, what tells one problem from another (its length,
    its difficulty) says nothing of the label; only what tells its answers apart does."""
    finals = Counter((s.problem, s.correct) for s in snapshots if s.final)
    rng = random.Random(seed)
    keep: dict[tuple[str, bool], set[int]] = {}
    for problem in sorted({p for p, _ in finals}):
        n = min(finals[problem, True], finals[problem, False])
        for label in (True, False):
            keep[problem, label] = set(rng.sample(range(finals[problem, label]), n))
    out, seen = [], Counter()
    for s in snapshots:  # a trajectory's snapshots end with its final one
        if seen[s.problem, s.correct] in keep[s.problem, s.correct]:
            out.append(s)
        seen[s.problem, s.correct] += s.final
    return out


def rerank(data: list[Snapshot], scores: np.ndarray) -> dict[str, Any]:
    """Best-of-N by score over each problem's final states, against their mean accuracy.

    This is what reranking needs: telling one problem's answers apart, which ROC-AUC over
    all problems mixes with telling easy problems from hard ones.
    """
    groups: dict[str, list[tuple[float, bool]]] = {}
    for s, z in zip(data, scores, strict=True):
        if s.final:
            groups.setdefault(s.problem, []).append((float(z), s.correct))
    groups = {p: g for p, g in groups.items() if len(g) > 1}
    if not groups:
        return {"problems": 0, "top1_accuracy": None, "mean_accuracy": None}
    top1 = [max(g, key=lambda item: item[0])[1] for g in groups.values()]
    mean = [sum(c for _, c in g) / len(g) for g in groups.values()]
    return {
        "problems": len(groups),
        "top1_accuracy": float(np.mean(top1)),
        "mean_accuracy": float(np.mean(mean)),
    }


def targets(snapshots: list[Snapshot], labels: str) -> torch.Tensor:
    """The BCE targets of `snapshots`: the trajectory's final correctness (0.0 or 1.0) with
    labels "final", the share of the state's rollouts that were correct with "rollout"."""
    if labels == "final":
        return torch.tensor([float(s.correct) for s in snapshots])
    if labels != "rollout":
        raise ValueError(f"labels must be 'final' or 'rollout', got {labels!r}")
    if any(s.value is None for s in snapshots):
        raise UserError(NO_ROLLOUTS)
    return torch.tensor([float(s.value) for s in snapshots])  # type: ignore[arg-type]


NO_ROLLOUTS = (
    "--labels rollout needs a collection with rollouts; collect one with "
    "dllmbench collect --rollouts R, or train with --labels final"
)


def evaluate(scorer: TrainableScorer, data: list[Snapshot], ratios: np.ndarray, batch: int) -> dict:
    """Validation BCE, accuracy and ROC-AUC, overall and by mask-ratio bucket, and the
    best-of-N accuracy of reranking each problem's final states by score, all against the
    final correctness; with rollouts in the data, `rollout_bce` against their shares too."""
    logits = []
    scorer.train_mode(False)
    with torch.no_grad():
        for i in range(0, len(data), batch):
            chunk = data[i : i + batch]
            logits.append(
                scorer.logits([s.tokens for s in chunk], [s.prompt_len for s in chunk])
                .float()
                .cpu()
            )
    z = torch.cat(logits)
    y = targets(data, "final")
    yn, zn = y.numpy(), z.numpy()
    buckets = {}
    for b in range(10):
        lo, hi = b / 10, (b + 1) / 10
        sel = (ratios >= lo) & ((ratios < hi) if b < 9 else (ratios <= hi))
        if sel.any():
            buckets[f"[{lo:.1f},{hi:.1f}{')' if b < 9 else ']'}"] = {
                "n": int(sel.sum()),
                "auc": auc(yn[sel], zn[sel]),
                "accuracy": float(((zn[sel] > 0) == (yn[sel] > 0.5)).mean()),
            }
    metrics = {
        "bce": float(torch.nn.functional.binary_cross_entropy_with_logits(z, y)),
        "accuracy": float(((zn > 0) == (yn > 0.5)).mean()),
        "auc": auc(yn, zn),
        "n": len(data),
        "rerank": rerank(data, zn),
        "by_mask_ratio": buckets,
    }
    if data and all(s.value is not None for s in data):
        shares = targets(data, "rollout")
        bce = torch.nn.functional.binary_cross_entropy_with_logits(z, shares)
        metrics["rollout_bce"] = float(bce)
    return metrics


@dataclass
class TrainData:
    """What a scorer trains and validates on, chosen from a collection."""

    train: list[Snapshot]
    validation: list[Snapshot]
    validation_ratios: np.ndarray  # each validation snapshot's mask ratio
    validation_problems: int
    digest: str  # data_digest() of train + validation, order included


def select_data(snapshots: list[Snapshot], cfg: TrainConfig, mask_id: int) -> TrainData:
    """Final states only for an ORM; held-out validation problems (a seeded sample of at most
    `max_val` snapshots); `groups` filtering of the training problems. Rollout labels need
    every snapshot to carry its rollouts' share."""
    if cfg.labels == "rollout" and any(s.value is None for s in snapshots):
        raise UserError(NO_ROLLOUTS)
    if cfg.kind == "orm":
        snapshots = [s for s in snapshots if s.final]
    val_ids = split_problems(snapshots, cfg.val_fraction, cfg.seed)
    train_set = [s for s in snapshots if s.problem not in val_ids]
    if cfg.groups != "all":
        mixed = mixed_problems(train_set)
        train_set = [s for s in train_set if s.problem in mixed]
    if cfg.groups == "balanced":
        train_set = balance(train_set, cfg.seed)
    val_set = [s for s in snapshots if s.problem in val_ids]
    random.Random(cfg.seed).shuffle(val_set)
    val_set = val_set[: cfg.max_val]
    if not train_set:
        raise UserError(
            "no training snapshots left after holding out validation problems"
            + (" and keeping problems with mixed outcomes" if cfg.groups != "all" else "")
        )
    return TrainData(
        train_set,
        val_set,
        mask_ratios(val_set, mask_id),
        len(val_ids),
        data_digest(train_set + val_set),
    )


@dataclass
class TrainState:
    """Everything a training run carries from step to step, and what `latest/` saves."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    step: int = 0
    best: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


def _state_file(out: Path) -> Path:
    return out / "latest" / "state.pt"


def resume(
    scorer: TrainableScorer, state: TrainState, cfg: TrainConfig, out: Path, data: str
) -> bool:
    """Load `out/latest` into the scorer and `state` if it holds this run; False if empty."""
    path = _state_file(out)
    if not path.exists():
        return False
    # on the CPU: a run saved on a GPU resumes anywhere (the optimizer's state follows the
    # parameters' device as it loads)
    saved = torch.load(path, weights_only=True, map_location="cpu")
    old, new = json.loads(saved["config"]), json.loads(json.dumps(asdict(cfg)))
    if old != new:
        differ = "; ".join(
            f"{k}: {old.get(k)!r} → {new.get(k)!r}"
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)
        )
        raise UserError(
            f"{out} holds a training run with another configuration ({differ}); "
            "choose another --out"
        )
    if saved.get("data", data) != data:
        raise UserError(f"{out} holds a training run on other trajectories; choose another --out")
    scorer.load_weights(out / "latest")
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.step, state.best = int(saved["step"]), json.loads(saved["best"])
    state.history = json.loads(saved["history"])
    torch.set_rng_state(saved["rng"])
    cuda = saved.get("cuda_rng", [])  # LoRA dropout on a GPU draws from the GPU's generator
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    return True


def save_checkpoint(
    scorer: TrainableScorer, state: TrainState, cfg: TrainConfig, out: Path, data: str
) -> None:
    """`latest/`: the scorer and everything needed to resume exactly."""
    scorer.save(out / "latest")
    torch.save(
        {
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "step": state.step,
            "config": json.dumps(asdict(cfg)),
            "data": data,
            "best": json.dumps(state.best),
            "history": json.dumps(state.history),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        },
        _state_file(out),
    )


def train_step(
    scorer: TrainableScorer, params: list, state: TrainState, data: TrainData, cfg: TrainConfig
) -> float:
    """One optimizer step over `accum` micro-batches; returns the step's training BCE."""
    scorer.train_mode(True)
    state.optimizer.zero_grad()
    total = 0.0
    per_step = cfg.batch * cfg.accum
    for micro in range(cfg.accum):
        start = state.step * per_step + micro * cfg.batch
        chunk = _batch(data.train, start, cfg.batch, cfg.seed)
        z = scorer.logits([s.tokens for s in chunk], [s.prompt_len for s in chunk])
        y = targets(chunk, cfg.labels).to(z.device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z.float(), y) / cfg.accum
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(params, cfg.clip)
    state.optimizer.step()
    state.scheduler.step()
    state.step += 1
    return total


def validate(
    scorer: TrainableScorer,
    state: TrainState,
    data: TrainData,
    cfg: TrainConfig,
    out: Path,
    total: float,
) -> str:
    """Evaluate on the validation set, note it in the history, keep the best in `best/`;
    returns the line to log."""
    metrics = evaluate(scorer, data.validation, data.validation_ratios, 2 * cfg.batch)
    top1 = metrics["rerank"]["top1_accuracy"]
    state.history.append(
        {
            "step": state.step,
            "train_bce": total,
            **{k: metrics[k] for k in ("bce", "rollout_bce", "accuracy", "auc") if k in metrics},
            "rerank_top1": top1,
        }
    )
    if state.best is None or metrics["bce"] < state.best["bce"]:
        state.best = {"step": state.step, **metrics}
        scorer.save(out / "best", {"validation": state.best})
    rollout = (
        f" (against rollouts {metrics['rollout_bce']:.4f})" if "rollout_bce" in metrics else ""
    )
    return (
        f"step {state.step}: train BCE {total:.4f}, validation BCE {metrics['bce']:.4f}"
        f"{rollout}, accuracy {metrics['accuracy']:.3f}, ROC-AUC {_fmt(metrics['auc'])}, "
        f"best-of-N {_fmt(top1)} (mean {_fmt(metrics['rerank']['mean_accuracy'])})"
    )


def train(
    scorer: TrainableScorer,
    snapshots: list[Snapshot],
    cfg: TrainConfig,
    out: Path,
    mask_id: int,
    log: Callable[[str], None] = print,
    advance: Callable[[int], None] | None = None,
    started: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train `scorer` and write best/, latest/ and train.json into `out`. `started(step)` is
    told the step training begins at (past 0 when it resumes), `advance(1)` each step after."""
    data = select_data(snapshots, cfg, mask_id)
    out.mkdir(parents=True, exist_ok=True)
    params = scorer.trainable()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = TrainState(
        opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.steps, cfg.warmup))
    )
    torch.manual_seed(cfg.seed)  # LoRA dropout draws from the global generator
    if resume(scorer, state, cfg, out, data.digest):
        log(f"resuming at step {state.step}")
    if started:
        started(state.step)
    while state.step < cfg.steps:
        total = train_step(scorer, params, state, data, cfg)
        if advance:
            advance(1)
        if state.step % cfg.val_every == 0 or state.step == cfg.steps:
            log(validate(scorer, state, data, cfg, out, total))
            save_checkpoint(scorer, state, cfg, out, data.digest)
    scorer.train_mode(False)
    record = {
        "config": asdict(cfg),
        "data": data.digest,
        "train": len(data.train),
        "validation": len(data.validation),
        "validation_problems": data.validation_problems,
        "best": state.best,
        "history": state.history,
    }
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def data_digest(snapshots: list[Snapshot]) -> str:
    """A digest of the snapshots a run trains and validates on (order included)."""
    digest = hashlib.blake2b(digest_size=16)
    for s in snapshots:
        digest.update(f"{s.problem}|{s.step}|{s.correct}|{s.final}|{s.prompt_len}|".encode())
        if s.value is not None:
            digest.update(f"{s.value!r}|".encode())
        digest.update(s.tokens.numpy().tobytes())
    return digest.hexdigest()


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _batch(data: list[Snapshot], start: int, size: int, seed: int) -> list[Snapshot]:
    """Items start..start+size of an endless stream of seeded epoch permutations."""
    out = []
    for position in range(start, start + size):
        epoch, offset = divmod(position, len(data))
        order = _permutation(len(data), seed, epoch)
        out.append(data[order[offset]])
    return out


_PERMUTATIONS: dict[tuple[int, int, int], list[int]] = {}


def _permutation(n: int, seed: int, epoch: int) -> list[int]:
    key = (n, seed, epoch)
    if key not in _PERMUTATIONS:
        _PERMUTATIONS.clear()
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        _PERMUTATIONS[key] = torch.randperm(n, generator=gen).tolist()
    return _PERMUTATIONS[key]
