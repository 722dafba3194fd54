"""Recompute report.json and controls.json from a run's files, independently of the analysis.

    python tests/independent/recompute.py RUN_DIR [--controls DIR] [--report FILE]

Reads the run directory (manifest.json, samples.jsonl, results.json) and the report
(RUN_DIR/report/report.json unless --report), and with --controls the controls folder
(controls.json) and its collection (collect.json, trajectories.jsonl, the snapshot shards).
Every number it recomputes comes from its own code over those files, following the
definitions of docs/results-schema.md, docs/scorers.md and docs/reproducing.md; it imports
nothing of the project's analysis, scoring or execution. The only project code it calls is
the plugin registry, to build the collection's backbone (its mask token) and the scorers
whose scores of the stored states the controls are made of: diagnose does not store them.

Prints each compared number (`ok` or `DIFF`) and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit
from scipy.stats import kendalltau
from sklearn.metrics import roc_auc_score

DIGITS = 6
BUCKETS = 10


# -- the comparison -------------------------------------------------------------------------


class Checker:
    """Collects comparisons of recomputed against reported values."""

    def __init__(self, verbose: bool = False) -> None:
        self.compared: list[tuple[str, Any, Any, bool]] = []
        self.verbose = verbose
        self.uncovered: list[str] = []

    def same(self, where: str, mine: Any, theirs: Any) -> None:
        ok = _equal(mine, theirs)
        self.compared.append((where, mine, theirs, ok))
        if self.verbose or not ok:
            print(f"{'ok  ' if ok else 'DIFF'} {where}: recomputed {mine!r}, report {theirs!r}")

    def interval(self, where: str, mine: dict | None, theirs: dict | None) -> None:
        if mine is None or theirs is None:
            self.same(where, mine, theirs)
            return
        for key in ("value", "low", "high", "exact", "mc_error"):
            if key in mine or key in theirs:
                self.same(f"{where}.{key}", mine.get(key), theirs.get(key))
        for key in ("better", "worse", "mcnemar_p", "mcnemar_agrees"):
            if key in mine or key in theirs:
                self.same(f"{where}.{key}", mine.get(key), theirs.get(key))

    def skip(self, what: str) -> None:
        self.uncovered.append(what)

    @property
    def differences(self) -> list[tuple[str, Any, Any, bool]]:
        return [c for c in self.compared if not c[3]]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or (a == b and type(a) is type(b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return round(float(a), DIGITS) == round(float(b), DIGITS)
    return a == b


def r6(x: float | None) -> float | None:
    return None if x is None else round(float(x), DIGITS)


# -- keyed generators and resampling ----------------------------------------------------------


def _blake(parts: tuple) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def bootstrap_rows(n: int, resamples: int, seed: int) -> np.ndarray:
    """The [resamples, n] problem indices every resampled interval of a run shares: numpy's
    default generator seeded by the 63-bit BLAKE2b-64 of repr(("numpy", "bootstrap", seed, n,
    resamples)), drawing integers in [0, n)."""
    key = _blake(("numpy", "bootstrap", int(seed), int(n), int(resamples))) & ((1 << 63) - 1)
    return np.random.default_rng(key).integers(0, n, size=(resamples, n))


def draw_counts(n: int, resamples: int, seed: int) -> np.ndarray:
    """How often each problem is drawn in each resample ([resamples, n])."""
    rows = bootstrap_rows(n, resamples, seed)
    out = np.zeros((resamples, n), np.int64)
    np.add.at(out, (np.repeat(np.arange(resamples), n), rows.ravel()), 1)
    return out


def tail(level: float) -> Fraction:
    return (1 - Fraction(str(level))) / 2


def _ceil(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def percentile(draws: np.ndarray, value: float, level: float) -> dict | None:
    """The resampled interval: ranks ⌈R·q⌉ and ⌈R·(1 − q)⌉ of the sorted defined draws, with
    the Monte-Carlo error of the ends (half the spread of ranks R·q ± one binomial SD)."""
    d = np.sort(draws[~np.isnan(draws)])
    r = d.size
    if r == 0:
        return None
    q = tail(level)
    lo_rank = min(max(_ceil(r * q), 1), r)
    hi_rank = min(max(_ceil(r * (1 - q)), 1), r)
    err = 0.0
    for qq in (float(q), float(1 - q)):
        sd = math.sqrt(r * qq * (1 - qq))
        a = d[max(math.floor(r * qq - sd), 0)]
        b = d[min(math.ceil(r * qq + sd), r - 1)]
        err = max(err, (float(b) - float(a)) / 2)
    return {
        "value": r6(value),
        "low": r6(d[lo_rank - 1]),
        "high": r6(d[hi_rank - 1]),
        "exact": False,
        "mc_error": r6(err),
    }


def _quantile(law: dict[Fraction, Fraction], q: Fraction) -> Fraction:
    """The smallest support value whose exact CDF reaches q."""
    acc = Fraction(0)
    for value in sorted(law):
        acc += law[value]
        if acc >= q:
            return value
    return max(law)


def is_binary(values: list[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def mean_interval(values: list[float], boot: tuple[int, int, float]) -> dict:
    """A mean over problems with its interval: exact binomial quantiles for 0/1 values (in
    rational arithmetic), else resampled with the run's index matrix."""
    seed, resamples, level = boot
    x = [float(v) for v in values]
    n = len(x)
    if is_binary(x):
        c = int(sum(x))
        law = {
            Fraction(k, n): Fraction(math.comb(n, k) * c**k * (n - c) ** (n - k), n**n)
            for k in range(n + 1)
        }
        q = tail(level)
        low, high = _quantile(law, q), _quantile(law, 1 - q)
        return {"value": r6(c / n), "low": r6(low), "high": r6(high), "exact": True}
    arr = np.array(x)
    draws = arr[bootstrap_rows(n, resamples, seed)].mean(axis=1)
    return percentile(draws, float(arr.mean()), level)


def point_or_mean(values: list[float], boot: tuple[int, int, float]) -> dict:
    """A spend: the point when every value is the same, else `mean_interval`."""
    if min(values) == max(values):
        v = r6(values[0])
        return {"value": v, "low": v, "high": v, "exact": True}
    return mean_interval(values, boot)


def paired(a: list[float], b: list[float], boot: tuple[int, int, float]) -> dict:
    """mean(a − b) with its paired interval; for 0/1 outcomes the exact trinomial law (in
    rational arithmetic) and the exact McNemar test."""
    seed, resamples, level = boot
    n = len(a)
    if is_binary(a) and is_binary(b):
        better = sum(1 for x, y in zip(a, b, strict=True) if x == 1 and y == 0)
        worse = sum(1 for x, y in zip(a, b, strict=True) if x == 0 and y == 1)
        ties = n - better - worse
        law: dict[Fraction, Fraction] = {}
        for bb in range(n + 1):
            for ww in range(n + 1 - bb):
                p = (
                    math.factorial(n)
                    // (math.factorial(bb) * math.factorial(ww) * math.factorial(n - bb - ww))
                    * better**bb
                    * worse**ww
                    * ties ** (n - bb - ww)
                )
                if p:
                    key = Fraction(bb - ww, n)
                    law[key] = law.get(key, Fraction(0)) + Fraction(p, n**n)
        q = tail(level)
        low, high = _quantile(law, q), _quantile(law, 1 - q)
        m = better + worse
        if m == 0:
            p_value = Fraction(1)
        else:
            p_value = min(
                Fraction(1),
                2 * Fraction(sum(math.comb(m, i) for i in range(min(better, worse) + 1)), 2**m),
            )
        excludes = low > 0 or high < 0
        return {
            "value": r6((better - worse) / n),
            "low": r6(low),
            "high": r6(high),
            "exact": True,
            "better": better,
            "worse": worse,
            "mcnemar_p": float(f"{float(p_value):.{DIGITS}g}"),
            "mcnemar_agrees": excludes == (p_value < 2 * tail(level)),
        }
    d = np.array(a) - np.array(b)
    draws = d[bootstrap_rows(n, resamples, seed)].mean(axis=1)
    return percentile(draws, float(d.mean()), level)


def ratio(num: list[float], den: list[float], counts: np.ndarray, level: float) -> dict | None:
    """Σ num / Σ den with the interval of the same ratio over resamples (draw counts)."""
    num_a, den_a = np.array(num, float), np.array(den, float)
    if not den_a.sum() > 0:
        return None
    tops, bottoms = counts @ num_a, counts @ den_a
    draws = np.array([t / b if b > 0 else np.nan for t, b in zip(tops, bottoms, strict=True)])
    return percentile(draws, float(num_a.sum() / den_a.sum()), level)


def median_ci(values: list[float], boot: tuple[int, int, float]) -> dict | None:
    seed, resamples, level = boot
    if not values:
        return None
    x = np.array(values, float)
    draws = np.median(x[bootstrap_rows(len(x), resamples, seed)], axis=1)
    return percentile(draws, float(np.median(x)), level)


# -- ROC-AUC, Kendall τ ------------------------------------------------------------------------


def weighted_auc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """P(score⁺ > score⁻) + ½ P(=) with each state weighted (its problem's draw count)."""
    return float(weighted_aucs(scores, labels, weights[None, :])[0])


def weighted_aucs(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`weighted_auc` for each row of a [R, states] weight matrix; NaN where a class weighs 0."""
    pos_w, neg_w = weights[:, labels], weights[:, ~labels]
    sp, sn = scores[labels], scores[~labels]
    pairs = (sp[:, None] > sn[None, :]) + 0.5 * (sp[:, None] == sn[None, :])
    num = ((pos_w @ pairs) * neg_w).sum(axis=1)
    den = pos_w.sum(axis=1) * neg_w.sum(axis=1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def auc_buckets(rows: list[tuple[Any, float, bool, float]], boot: tuple[int, int, float]) -> list:
    """Ten mask buckets over (problem, score, label, mask ratio) states: ROC-AUC and its
    interval clustered by problem (problems indexed by first appearance)."""
    seed, resamples, level = boot
    order = list(dict.fromkeys(r[0] for r in rows))
    index = {p: i for i, p in enumerate(order)}
    counts = draw_counts(len(order), resamples, seed) if rows else None
    out = []
    for b in range(BUCKETS):
        members = [r for r in rows if min(math.floor(r[3] * 10), 9) == b]
        labels = np.array([r[2] for r in members], bool)
        scores = np.array([r[1] for r in members], float)
        auc = interval = None
        if 0 < labels.sum() < labels.size:
            auc = float(roc_auc_score(labels, scores))
            cluster = np.array([index[r[0]] for r in members])
            draws = weighted_aucs(scores, labels, counts[:, cluster].astype(float))
            interval = percentile(draws, auc, level)
        out.append(
            {
                "low": b / 10,
                "high": (b + 1) / 10,
                "n": int(labels.size),
                "positives": int(labels.sum()),
                "auc": r6(auc),
                "interval": interval,
            }
        )
    return out


def kendall(rows: list[tuple[Any, float, bool, float]], boot) -> dict:
    by: dict[Any, list] = {}
    for r in rows:
        by.setdefault(r[0], []).append(r)
    taus = []
    mixed = 0
    for members in by.values():
        labels = [int(r[2]) for r in members]
        if 0 < sum(labels) < len(labels):
            mixed += 1
            taus.append(float(kendalltau([r[1] for r in members], labels).statistic))
    defined = [t for t in taus if not math.isnan(t)]
    return {
        "median": r6(np.median(defined)) if defined else None,
        "interval": median_ci(defined, boot),
        "mean": r6(np.mean(defined)) if defined else None,
        "problems": mixed,
        "undefined": mixed - len(defined),
    }


# -- a run -------------------------------------------------------------------------------------


def natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


class Run:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.manifest = json.loads((path / "manifest.json").read_text())
        self.results = json.loads((path / "results.json").read_text())
        self.records: list[dict] = []
        for name in sorted(path.glob("samples*.jsonl")):
            for line in name.read_text().splitlines():
                if line.strip():
                    self.records.append(json.loads(line))
        self.methods = {m["id"]: m for m in self.manifest["methods"]}
        self.by_method: dict[str, dict[str, dict]] = {m: {} for m in self.methods}
        for r in self.records:
            if r["method"] in self.by_method:
                self.by_method[r["method"]][r["problem"]] = r
        self.problems = sorted({r["problem"] for r in self.records}, key=natural)
        self.seed = int(self.manifest["sampling"]["seed"])

    def evidence(self, mid: str) -> dict:
        return dict(self.methods[mid].get("evidence") or {})

    def key(self, mid: str) -> str:
        m = self.methods[mid]
        size = self.evidence(mid).get("nested")
        opts = [f"{k}={v}" for k, v in sorted(m["strategy"]["config"].items()) if k != size]
        return m["strategy"]["name"] + (":" + ",".join(opts) if opts else "")

    def plain(self, mid: str) -> bool:
        e = self.evidence(mid)
        return bool(e.get("plain")) and e.get("nested") is not None

    def shared(self, keep) -> dict[str, dict[str, list[dict]]]:
        """Pool key → problem → the merged pool of the methods sharing it."""
        groups: dict[str, list[str]] = {}
        for mid in self.methods:
            if keep(mid):
                groups.setdefault(self.key(mid), []).append(mid)
        out = {}
        for key, mids in groups.items():
            pools = {}
            for pid in self.problems:
                recs = [self.by_method[m][pid] for m in mids if pid in self.by_method[m]]
                if not recs:
                    continue
                merged: list[dict] = []
                for rec in recs:
                    for i, c in enumerate(rec["candidates"]):
                        if i == len(merged):
                            merged.append({**c, "scores": dict(c["scores"])})
                        else:
                            merged[i]["scores"].update(c["scores"])
                pools[pid] = merged
            out[key] = pools
        return out

    def continuations(self) -> dict[tuple[str, tuple], bool]:
        def unoptioned(mid: str) -> bool:
            size = self.evidence(mid).get("nested")
            extra = [k for k in self.methods[mid]["strategy"]["config"] if k != size]
            return self.plain(mid) and not extra

        return {
            (pid, tuple(c["lineage"])): bool(c["correct"])
            for pools in self.shared(unoptioned).values()
            for pid, pool in pools.items()
            for c in pool
        }

    def guided(self, what: str):
        """(pool key, problem, scorer, record) of each strategy run declaring `what` once."""
        seen = set()
        for mid in self.methods:
            scorer = self.evidence(mid).get(what)
            if not scorer:
                continue
            key = self.key(mid)
            for pid in self.problems:
                rec = self.by_method[mid].get(pid)
                if rec is not None and (key, pid) not in seen:
                    seen.add((key, pid))
                    yield key, pid, scorer, rec


def segments(info: dict) -> list[dict] | None:
    if not all(k in info for k in ("step", "mask", "scores", "parent", "kept")):
        return None
    out: list[dict] = []
    for s, parents in enumerate(info["parent"]):
        if s == 0:
            lineage = [(i,) for i in range(len(parents))]
        else:
            lineage = [
                out[-1]["lineage"][p] + (c - parents.index(p),) for c, p in enumerate(parents)
            ]
        out.append(
            {
                "step": info["step"][s],
                "lineage": lineage,
                "mask": info["mask"][s],
                "scores": info["scores"][s],
                "kept": list(info["kept"][s]),
            }
        )
    return out


def edits_until(cand: dict, until: int | None = None) -> tuple:
    return tuple(
        (int(s), tuple(int(p) for p in pos))
        for s, pos in cand.get("edits") or ()
        if until is None or int(s) <= until
    )


def guided_states(run: Run, scorer: str) -> list[tuple[tuple, str, tuple]]:
    """(identity, kind, (problem, score, label, mask)) of every labelled guided state."""
    crn = run.continuations()
    out, seen = [], set()
    for key, pid, sc, rec in run.guided("cuts"):
        segs = segments(rec.get("info") or {})
        if segs is None or sc != scorer:
            continue
        cands = rec["candidates"]
        last = len(segs) - 1
        for s, seg in enumerate(segs):
            for child in range(len(seg["lineage"])):
                if s == last and len(seg["kept"]) == len(seg["lineage"]):
                    label = bool(cands[seg["kept"].index(child)]["correct"])
                elif s == 0:
                    label = crn.get((pid, seg["lineage"][child]))
                else:
                    label = None
                if label is None:
                    continue
                edited = any(edits_until(c, seg["step"]) for c in cands)
                history = (
                    tuple(x["step"] for x in segs[:s]),
                    seg["step"],
                    seg["lineage"][child],
                    key if edited else None,
                )
                content: tuple = (seg["mask"][child], seg["scores"][child])
                if s == last and child in seg["kept"]:
                    c = cands[seg["kept"].index(child)]
                    content = (*content, c["text"], edits_until(c))
                ident = (pid, history, content)
                kind = "final" if s == last else ("first_segment" if s == 0 else "later_segment")
                if ident not in seen:
                    seen.add(ident)
                    row = (pid, float(seg["scores"][child]), bool(label), float(seg["mask"][child]))
                    out.append((ident, kind, row))
    return out


def final_states(run: Run, scorer: str) -> list[tuple[tuple, str, tuple]]:
    out, seen = [], set()
    for key, pools in run.shared(run.plain).items():
        for pid, pool in pools.items():
            for c in pool:
                if scorer not in c["scores"]:
                    continue
                ident = (pid, (key, tuple(c["lineage"])), (c["text"], edits_until(c)))
                if ident not in seen:
                    seen.add(ident)
                    out.append(
                        (ident, "final", (pid, float(c["scores"][scorer]), bool(c["correct"]), 0.0))
                    )
    return out


# -- pooled estimators ---------------------------------------------------------------------------


def vote_correct(
    subset: tuple[int, ...],
    keys: list,
    weights: np.ndarray,
    correct: list[bool],
    invalid_votes: bool,
) -> bool:
    """The vote on one subset (positions ascending): each answer totals its weights in subset
    order; the largest total wins, a tie going to the answer seen first in the subset; the
    pick is its first holder. Invalid answers never vote, or vote as one never-correct bloc."""
    totals: dict[Any, float] = {}
    first: dict[Any, int] = {}
    bloc = ("<invalid>",)
    for pos in subset:
        k = keys[pos]
        if k is None:
            if not invalid_votes:
                continue
            k = bloc
        totals[k] = totals.get(k, 0.0) + float(weights[pos])
        first.setdefault(k, pos)
    if not totals:
        return False
    best = max(totals.values())
    winner = min((k for k in totals if totals[k] == best), key=lambda k: first[k])
    if winner is bloc:
        return False
    return bool(correct[first[winner]])


def mc_rows(seed: int, problem: int, k: int, n: int, samples: int) -> np.ndarray:
    rng = np.random.default_rng(_blake(("pooled", "subsets", int(seed), int(problem), int(k))))
    return np.sort(np.argsort(rng.random((samples, n)), axis=1)[:, :k], axis=1)


def vote_estimate(pool, k, selector, i, section, seed, full) -> tuple[float, float, bool]:
    """One problem's estimate of a voting selector at k: (value, stderr, exact): every
    k-subset when C(n, k) is at most `exact_limit` or k = n; Majority by answer counts on the
    whole pool when they are at most `count_limit` vectors; else the mean over `samples`
    subsets drawn from the generator keyed by (seed, problem index, k)."""
    n = len(pool)
    keys = [c["key"] if c["valid"] else None for c in pool]
    correct = [bool(c["correct"]) and c["valid"] for c in pool]
    invalid_votes = selector == "majority:invalid=vote"
    if selector in ("majority", "majority:invalid=vote"):
        w = np.ones(n)
    elif selector == "weighted_majority:weight":
        w = np.array([c["weight"] for c in pool], float)
    else:
        w = expit(np.array([c["scores"][selector.split(":", 1)[1]] for c in pool], float))
    if k == n or math.comb(n, k) <= section["exact_limit"]:
        outs = [
            vote_correct(s, keys, w, correct, invalid_votes)
            for s in itertools.combinations(range(n), k)
        ]
        return float(np.mean(outs)), 0.0, True
    if full and selector in ("majority", "majority:invalid=vote") and section["count_limit"] > 0:
        exact = majority_by_answer_counts(keys, correct, k, invalid_votes, section["count_limit"])
        if exact is not None:
            return float(exact), 0.0, True
    rows = mc_rows(seed, i, k, n, section["samples"])
    outs = monte_carlo_votes(rows, keys, w, np.array(correct), invalid_votes)
    return float(outs.mean()), float(outs.std(ddof=1) / math.sqrt(outs.size)), False


def monte_carlo_votes(
    rows: np.ndarray, keys: list, w: np.ndarray, correct: np.ndarray, invalid_votes: bool
) -> np.ndarray:
    """The vote (as `vote_correct`) on every sampled subset row at once."""
    labels: dict[Any, int] = {}
    ids = np.array([-1 if k is None else labels.setdefault(k, len(labels)) for k in keys])
    if invalid_votes:
        ids = np.where(ids < 0, len(labels), ids)
    groups = int(ids.max()) + 1 if ids.size else 0
    s, k = rows.shape
    totals = np.zeros((s, max(groups, 1)))
    first = np.full((s, max(groups, 1)), k + 1)
    seen = np.zeros((s, max(groups, 1)), bool)
    at = np.arange(s)
    for j in range(k):
        g = ids[rows[:, j]]
        ok = g >= 0
        totals[at[ok], g[ok]] += w[rows[ok, j]]
        fresh = ok & ~seen[at, np.where(ok, g, 0)]
        first[at[fresh], g[fresh]] = j
        seen[at[ok], g[ok]] = True
    totals = np.where(seen, totals, -np.inf)
    best = totals.max(axis=1, keepdims=True)
    tied_first = np.where(seen & (totals == best), first, k + 1)
    winner = tied_first.argmin(axis=1)
    col = tied_first[at, winner]
    has = col <= k - 1
    chosen = rows[at, np.minimum(col, k - 1)]
    bloc = invalid_votes & (winner == len(labels))
    return (has & ~bloc & correct[chosen]).astype(float)


def majority_by_answer_counts(keys, correct, k, invalid_votes, limit) -> Fraction | None:
    """Exact Majority@k over uniform k-subsets by how many candidates of each answer the
    subset holds: each answer's chosen positions are a uniform subset of its positions;
    the answers of the largest count tie, the one whose first chosen position is earliest
    wins and that candidate is the pick. None past `limit` count vectors."""
    n = len(keys)
    order: dict[Any, list[int]] = {}
    dropped = 0
    bloc = ("<invalid>",)
    for pos, key in enumerate(keys):
        if key is None and not invalid_votes:
            dropped += 1
            continue
        order.setdefault(bloc if key is None else key, []).append(pos)
    names = list(order)
    sizes = [dropped] + [len(order[a]) for a in names]

    def vectors(i: int, left: int):
        if i == len(sizes):
            if left == 0:
                yield ()
            return
        for c in range(min(sizes[i], left) + 1):
            for rest in vectors(i + 1, left - c):
                yield (c, *rest)

    found = list(itertools.islice(vectors(0, k), limit + 1))
    if len(found) > limit:
        return None
    total = Fraction(0)
    for vec in found:
        ways = math.prod(math.comb(m, c) for m, c in zip(sizes, vec, strict=True))
        counts = vec[1:]
        top = max(counts, default=0)
        if top == 0:
            continue
        tied = [a for a, c in zip(names, counts, strict=True) if c == top]
        win = Fraction(0)
        for a in tied:
            if a is bloc:
                continue
            pos_a = order[a]
            for i, p in enumerate(pos_a):
                if not correct[p]:
                    continue
                # p is the first chosen of a: p chosen, top-1 of the later ones
                pr = Fraction(math.comb(len(pos_a) - 1 - i, top - 1), math.comb(len(pos_a), top))
                for b in tied:
                    if b is not a:
                        later = sum(1 for q in order[b] if q > p)
                        pr *= Fraction(math.comb(later, top), math.comb(len(order[b]), top))
                win += pr
        total += ways * win
    return total / math.comb(n, k)


def pooled_values(pools: list[list[dict]], selector: str, k: int, section, seed, full) -> list:
    out = []
    for i, pool in enumerate(pools):
        n = len(pool)
        corr = [bool(c["correct"]) for c in pool]
        c = sum(corr)
        if selector == "oracle":
            out.append((1 - Fraction(math.comb(n - c, k), math.comb(n, k)), 0.0, True))
        elif selector == "random":
            out.append((Fraction(c, n), 0.0, True))
        elif selector.startswith("argmax:"):
            name = selector.split(":", 1)[1]
            order = sorted(range(n), key=lambda j: (-float(pool[j]["scores"][name]), j))
            ways = sum(math.comb(n - 1 - r, k - 1) for r, j in enumerate(order) if corr[j])
            out.append((Fraction(ways, math.comb(n, k)), 0.0, True))
        else:
            out.append(vote_estimate(pool, k, selector, i, section, seed, full))
    return out


def check_pooled(run: Run, report: dict, ck: Checker, boot) -> None:
    section = report.get("pooled")
    if section is None:
        ck.skip("pooled: null in the report")
        return
    pools_by_key = run.shared(run.plain)
    best = None
    for key, pools in pools_by_key.items():
        size = min(len(p) for p in pools.values())
        if size >= 2 and (best is None or size > best[0]):
            best = (size, key, pools)
    assert best is not None
    size, key, pools = best
    ck.same("pooled.pool", key, section["pool"])
    ck.same("pooled.size", size, section["size"])
    ck.same("pooled.problems", len(pools), section["problems"])
    plist = list(pools.values())
    per_cand: dict[str, float] = {}
    for mid in run.methods:
        m = run.methods[mid]
        field = run.evidence(mid).get("nested")
        n = int(m["strategy"]["config"].get(field, 0)) if field else 0
        if run.key(mid) != key or n < 1:
            continue
        for kind, passes in m.get("cost", {}).items():
            per_cand.setdefault(kind, passes / n)
    for curve in section["curves"]:
        sel, psize = curve["selector"], curve["pool_size"]
        prefix = [p[:psize] for p in plist]
        fam, _, sc = sel.partition(":")
        kinds = ["denoise"] + (
            [f"score:{sc}"] if fam in ("argmax", "weighted_majority") and sc else []
        )
        for point in curve["points"]:
            k = point["k"]
            where = f"pooled.{sel}@{k}"
            ck.same(
                f"{where}.passes",
                round(k * sum(per_cand.get(x, 0.0) for x in kinds)),
                point["passes"],
            )
            vals = pooled_values(prefix, sel, k, section, report["seed"], psize == size)
            per = [float(v[0]) for v in vals]
            ck.same(f"{where}.exact", all(v[2] for v in vals), point["exact"])
            stderr = math.sqrt(sum(v[1] ** 2 for v in vals)) / len(vals)
            ck.same(f"{where}.stderr", r6(stderr), point["stderr"])
            ck.interval(f"{where}.accuracy", mean_interval(per, boot), point["accuracy"])
    curves = {c["selector"]: c["pool_size"] for c in section["curves"]}
    problems = list(pools)
    mine = []
    for mid, m in run.methods.items():
        name, config = m["selector"]["name"], m["selector"].get("config", {})
        if run.key(mid) != key or name == "random":
            continue
        if name == "majority":
            sel = "majority:invalid=vote" if config.get("invalid", "drop") == "vote" else "majority"
        elif name == "oracle":
            sel = "oracle"
        elif name == "argmax":
            sel = f"argmax:{config.get('scorer')}"
        elif name == "weighted_majority":
            sel = f"weighted_majority:{config.get('by')}"
        else:
            continue
        field = run.evidence(mid).get("nested")
        n = int(m["strategy"]["config"].get(field, 0)) if field else 0
        if curves.get(sel) != n:
            continue
        vals = pooled_values([p[:n] for p in plist], sel, n, section, report["seed"], n == size)
        per = [float(v[0]) for v in vals]
        ran = [
            float(run.by_method[mid][p]["correct"]) if p in run.by_method[mid] else None
            for p in problems
        ]
        mine.append(
            {
                "method": mid,
                "selector": sel,
                "k": n,
                "pooled": r6(np.mean(per)),
                "run": r6(np.mean([x or 0.0 for x in ran])),
                "equal": per == ran,
            }
        )
    theirs = {a["method"]: a for a in section["agreement"]}
    ck.same("pooled.agreement.methods", [a["method"] for a in mine], list(theirs))
    for a in mine:
        for name in ("selector", "k", "pooled", "run", "equal"):
            ck.same(
                f"pooled.agreement[{a['method']}].{name}",
                a[name],
                theirs.get(a["method"], {}).get(name),
            )


# -- run sections --------------------------------------------------------------------------------


def check_methods(run: Run, report: dict, ck: Checker, boot) -> None:
    order = {p: i for i, p in enumerate(run.manifest["task"]["problem_ids"])}
    results = run.results
    ref = results["reference"]
    ref_recs = run.by_method.get(ref, {})
    mine: dict[tuple[str, int], dict] = {}
    for m in run.manifest["methods"]:
        recs = sorted(
            (r for p, r in run.by_method[m["id"]].items() if p in order),
            key=lambda r: order[r["problem"]],
        )
        correct = [float(r["correct"]) for r in recs]
        passes = [float(r["ledger"]["total_passes"]) for r in recs]
        flops = [r["ledger"].get("total_flops") for r in recs]
        e: dict[str, Any] = {"problems": len(recs)}
        e["accuracy"] = mean_interval(correct, boot) if recs else None
        e["passes_per_problem"] = float(np.mean(passes)) if recs else None
        known = None not in flops and bool(recs)
        e["flops_per_problem"] = float(np.mean(np.array(flops, float))) if known else None
        e["spend.passes"] = point_or_mean(passes, boot) if recs else None
        e["spend.flops"] = point_or_mean([float(f) for f in flops], boot) if known else None
        e["planned_passes"] = sum(m["cost"].values())
        pools = [r["candidates"] for r in recs]
        if pools and max(len(p) for p in pools) > 1:
            keys = [[c["key"] if c["valid"] else None for c in p] for p in pools]
            e["pool.size"] = r6(np.mean([len(p) for p in pools]))
            e["pool.oracle"] = mean_interval(
                [float(any(c["correct"] for c in p)) for p in pools], boot
            )
            e["pool.unique_answers"] = r6(
                np.mean([len({k for k in ks if k is not None}) for ks in keys])
            )
            ents = []
            for ks in keys:
                cnt = Counter(k for k in ks if k is not None)
                tot = sum(cnt.values())
                ents.append(
                    -sum(v / tot * math.log2(v / tot) for v in cnt.values()) if tot else 0.0
                )
            e["pool.entropy_bits"] = r6(np.mean(ents))
        if ref is not None and m["id"] != ref:
            common = [r for r in recs if r["problem"] in ref_recs]
            if common:
                d = paired(
                    [float(r["correct"]) for r in common],
                    [float(ref_recs[r["problem"]]["correct"]) for r in common],
                    boot,
                )
                e["delta_vs_reference"] = {**d, "problems": len(common)}
        for b in m.get("budgets") or [results["budget"]]:
            unit = results.get("budget_unit", "passes")
            planned = e["planned_passes"] if unit == "passes" else (m.get("flops") or 0)
            mine[(m["id"], b)] = {**e, "share_of_budget": round(planned / b, 6)}
    for entry in report["methods"]:
        if entry["run"] != 0:
            continue
        where = f"methods[{entry['id']}@{entry['budget']}]"
        e = mine[(entry["id"], entry["budget"])]
        for name in (
            "problems",
            "passes_per_problem",
            "flops_per_problem",
            "planned_passes",
            "share_of_budget",
        ):
            ck.same(f"{where}.{name}", e[name], entry[name])
        ck.interval(f"{where}.accuracy", e["accuracy"], entry["accuracy"])
        spend = entry.get("spend") or {}
        ck.interval(f"{where}.spend.passes", e["spend.passes"], spend.get("passes"))
        ck.interval(f"{where}.spend.flops", e["spend.flops"], spend.get("flops"))
        if "pool" in entry or "pool.size" in e:
            pool = entry.get("pool") or {}
            ck.same(f"{where}.pool.size", e.get("pool.size"), pool.get("size"))
            ck.interval(f"{where}.pool.oracle", e.get("pool.oracle"), pool.get("oracle"))
            ck.same(
                f"{where}.pool.unique_answers",
                e.get("pool.unique_answers"),
                pool.get("unique_answers"),
            )
            ck.same(
                f"{where}.pool.entropy_bits", e.get("pool.entropy_bits"), pool.get("entropy_bits")
            )
        mine_d, theirs_d = e.get("delta_vs_reference"), entry.get("delta_vs_reference")
        ck.interval(f"{where}.delta_vs_reference", mine_d, theirs_d)
        if mine_d and theirs_d:
            ck.same(
                f"{where}.delta_vs_reference.problems", mine_d["problems"], theirs_d["problems"]
            )


def check_discrimination(run: Run, report: dict, ck: Checker, boot) -> None:
    got = {(d["scorer"], d["states"]): d for d in report["diagnostics"]["discrimination"]}
    expected = set()
    for scorer in sorted(run.manifest.get("scorers") or {}):
        for kind, states in (
            ("guided", guided_states(run, scorer)),
            ("final", final_states(run, scorer)),
        ):
            if not states:
                continue
            expected.add((scorer, kind))
            theirs = got.get((scorer, kind))
            where = f"discrimination[{scorer},{kind}]"
            if theirs is None:
                ck.same(where, "present", None)
                continue
            rows = [s[2] for s in states]
            ck.same(f"{where}.count", len(rows), theirs["count"])
            ck.same(f"{where}.positives", sum(r[2] for r in rows), theirs["positives"])
            for b, tb in zip(auc_buckets(rows, boot), theirs["roc_auc_by_mask"], strict=True):
                bw = f"{where}.bucket[{b['low']:.1f}]"
                for name in ("low", "high", "n", "positives", "auc"):
                    ck.same(f"{bw}.{name}", b[name], tb[name])
                ck.interval(f"{bw}.interval", b["interval"], tb["interval"])
            kinds = [
                k
                for k in ("first_segment", "later_segment", "final")
                if any(s[1] == k for s in states)
            ]
            ck.same(f"{where}.kendall_kinds", kinds, [t["states"] for t in theirs["kendall_tau"]])
            for kind_name, tk in zip(kinds, theirs["kendall_tau"], strict=False):
                sub = [s[2] for s in states if s[1] == kind_name]
                mk = kendall(sub, boot)
                kw = f"{where}.kendall[{kind_name}]"
                ck.same(f"{kw}.count", len(sub), tk["count"])
                for name in ("median", "mean", "problems", "undefined"):
                    ck.same(f"{kw}.{name}", mk[name], tk[name])
                ck.interval(f"{kw}.interval", mk["interval"], tk["interval"])
    ck.same("discrimination.entries", sorted(expected), sorted(got))


def check_pools(run: Run, report: dict, ck: Checker, boot) -> None:
    got = {p["pool"]: p for p in report["diagnostics"]["pools"]}
    groups: dict[str, list[str]] = {}
    for mid, m in run.methods.items():
        groups.setdefault(m["spec"].split("+")[0], []).append(mid)
    names = []
    for name, mids in groups.items():
        recs = run.by_method[mids[0]]
        pools = [recs[p]["candidates"] for p in run.problems if p in recs]
        if not pools or min(len(p) for p in pools) < 2:
            continue
        names.append(name)
        theirs = got.get(name)
        where = f"pools[{name}]"
        if theirs is None:
            ck.same(where, "present", None)
            continue
        ck.same(f"{where}.methods", mids, theirs["methods"])
        ck.same(f"{where}.size", min(len(p) for p in pools), theirs["size"])
        ck.same(f"{where}.problems", len(pools), theirs["problems"])
        oracle = [float(any(c["correct"] for c in p)) for p in pools]
        uniq, ent = [], []
        for p in pools:
            cnt = Counter(c["key"] for c in p if c["key"] is not None)
            tot = sum(cnt.values())
            uniq.append(float(len(cnt)))
            ent.append(
                -sum(v / tot * math.log2(v / tot) for v in cnt.values()) + 0.0 if tot else 0.0
            )
        ck.interval(f"{where}.oracle", mean_interval(oracle, boot), theirs["oracle"])
        ck.interval(f"{where}.unique_answers", mean_interval(uniq, boot), theirs["unique_answers"])
        ck.interval(f"{where}.entropy_bits", mean_interval(ent, boot), theirs["entropy_bits"])
    ck.same("pools.entries", sorted(names), sorted(got))


def check_removal(run: Run, report: dict, ck: Checker, boot) -> None:
    seed, resamples, level = boot
    got = {r["pool"]: r for r in report["diagnostics"]["removal_risk"]}
    crn = run.continuations()
    keys: dict[str, list[str]] = {}
    for mid in run.methods:
        if run.evidence(mid).get("cuts"):
            keys.setdefault(run.key(mid), []).append(mid)
    for key, mids in keys.items():
        lost_l, risk_l = [], []
        for k2, pid, _, rec in run.guided("cuts"):
            if k2 != key:
                continue
            segs = segments(rec.get("info") or {})
            if segs is None or len(segs) < 2:
                continue
            first = segs[0]
            reach = [crn.get((pid, lin)) for lin in first["lineage"]]
            if None in reach:
                continue
            good = {i for i, ok in enumerate(reach) if ok}
            risk_l.append(1.0 if good else 0.0)
            lost_l.append(1.0 if good and not good & set(first["kept"]) else 0.0)
        if not risk_l:
            continue
        where = f"removal_risk[{key}]"
        theirs = got.get(key)
        if theirs is None:
            ck.same(where, "present", None)
            continue
        ck.same(f"{where}.methods", mids, theirs["methods"])
        ck.same(f"{where}.events", len(risk_l), theirs["events"])
        ck.same(f"{where}.at_risk", int(sum(risk_l)), theirs["at_risk"])
        ck.same(f"{where}.lost", int(sum(lost_l)), theirs["lost"])
        ck.same(
            f"{where}.rate", r6(sum(lost_l) / sum(risk_l)) if sum(risk_l) else None, theirs["rate"]
        )
        counts = draw_counts(len(risk_l), resamples, seed)
        ck.interval(f"{where}.interval", ratio(lost_l, risk_l, counts, level), theirs["interval"])


def check_smc(run: Run, report: dict, ck: Checker) -> None:
    got = {p["pool"]: p for p in report["diagnostics"]["particles"]}
    keys: dict[str, list[str]] = {}
    for mid in run.methods:
        if run.evidence(mid).get("particles"):
            keys.setdefault(run.key(mid), []).append(mid)
    for key, mids in keys.items():
        cps = []
        per_run = None
        for k2, _pid, _, rec in run.guided("particles"):
            info = rec.get("info") or {}
            if k2 != key or "weights" not in info:
                continue
            per_run = len(info["resampled"]) if per_run is None else per_run
            ess_rec = info.get("ess") or []
            for j, res in enumerate(info["resampled"]):
                w = np.array(info["weights"][j], float)
                w = w / w.sum()
                ess = float(ess_rec[j]) if j < len(ess_rec) else float(1 / np.sum(w * w))
                anc = info["ancestors"][j] if res else list(range(w.size))
                cnt = np.array(list(Counter(anc).values()), float)
                f = cnt / cnt.sum()
                cps.append(
                    {
                        "before": ess,
                        "after": float(w.size) if res else ess,
                        "res": bool(res),
                        "beta": float(info["beta"][j]),
                        "distinct": cnt.size,
                        "perp": float(np.exp(-(f * np.log(f)).sum())),
                        "j": j,
                    }
                )
        if not cps:
            continue
        where = f"particles[{key}]"
        t = got.get(key)
        if t is None:
            ck.same(where, "present", None)
            continue
        res = [c for c in cps if c["res"]]
        ck.same(f"{where}.methods", mids, t["methods"])
        ck.same(f"{where}.checkpoints", len(cps), t["checkpoints"])
        ck.same(f"{where}.ess_before", r6(np.mean([c["before"] for c in cps])), t["ess_before"])
        ck.same(f"{where}.ess_after", r6(np.mean([c["after"] for c in cps])), t["ess_after"])
        ck.same(f"{where}.resample_rate", r6(len(res) / len(cps)), t["resample_rate"])
        betas = [c["beta"] for c in cps]
        for name, v in (("mean", np.mean(betas)), ("min", min(betas)), ("max", max(betas))):
            ck.same(f"{where}.beta.{name}", r6(v), t["beta"][name])
        ck.same(
            f"{where}.distinct_ancestors",
            r6(np.mean([c["distinct"] for c in res])) if res else None,
            t["distinct_ancestors"],
        )
        ck.same(
            f"{where}.ancestor_perplexity",
            r6(np.mean([c["perp"] for c in res])) if res else None,
            t["ancestor_perplexity"],
        )
        for row in t["by_checkpoint"]:
            j = row["index"]
            at = [c for c in cps if c["j"] == j]
            ck.same(
                f"{where}.by_checkpoint[{j}].ess_before",
                r6(np.mean([c["before"] for c in at])),
                row["ess_before"],
            )
            ck.same(
                f"{where}.by_checkpoint[{j}].ess_after",
                r6(np.mean([c["after"] for c in at])),
                row["ess_after"],
            )


def swap_entries(
    pools: list[list[tuple[dict, bool]]], scorers: list[str], boot
) -> tuple[dict, list]:
    per: dict[str, list[float]] = {}
    for name in scorers:
        vals = []
        for pool in pools:
            order = sorted(range(len(pool)), key=lambda j: (-pool[j][0][name], j))
            vals.append(float(pool[order[0]][1]))
        per[name] = vals
    per["random"] = [float(np.mean([c for _, c in pool])) for pool in pools]
    acc = {name: mean_interval(v, boot) for name, v in per.items()}
    names = list(per)
    diffs = [
        {"a": a, "b": b, **paired(per[a], per[b], boot)}
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    return acc, diffs


def check_swap_section(where: str, acc: dict, diffs: list, theirs: dict, ck: Checker) -> None:
    ck.same(f"{where}.selectors", sorted(acc), sorted(theirs["accuracy"]))
    for name, iv in acc.items():
        ck.interval(f"{where}.accuracy[{name}]", iv, theirs["accuracy"].get(name))
    tdiff = {(d["a"], d["b"]): d for d in theirs["differences"]}
    ck.same(f"{where}.pairs", [(d["a"], d["b"]) for d in diffs], list(tdiff))
    for d in diffs:
        ck.interval(f"{where}.differences[{d['a']}-{d['b']}]", d, tdiff.get((d["a"], d["b"])))


def check_scorer_swap(run: Run, report: dict, ck: Checker, boot) -> None:
    theirs = report["diagnostics"]["scorer_swap"]
    best = None
    for key, pools in run.shared(run.plain).items():
        size = min(len(p) for p in pools.values())
        if size >= 2 and (best is None or size > best[0]):
            best = (size, key, list(pools.values()))
    if best is None:
        ck.same("scorer_swap", None, theirs)
        return
    _, key, pools = best
    scorers = sorted({s for p in pools for c in p for s in c["scores"]})

    def prefix(name: str) -> int:
        sizes = []
        for p in pools:
            n = 0
            while n < len(p) and name in p[n]["scores"]:
                n += 1
            sizes.append(n)
        return min(sizes)

    size = min((prefix(s) for s in scorers), default=0)
    if size < 2:
        ck.same("scorer_swap", None, theirs)
        return
    cut = [
        [({s: float(c["scores"][s]) for s in scorers}, bool(c["correct"])) for c in p[:size]]
        for p in pools
    ]
    acc, diffs = swap_entries(cut, scorers, boot)
    ck.same("scorer_swap.pool", key, theirs["pool"])
    ck.same("scorer_swap.size", size, theirs["size"])
    check_swap_section("scorer_swap", acc, diffs, theirs, ck)


def check_run(run_dir: Path, report: dict, ck: Checker) -> None:
    run = Run(run_dir)
    stats = run.manifest["statistics"]
    boot = (run.seed, int(run.results["resamples"]), float(run.results["level"]))
    ck.same("seed", run.seed, report["seed"])
    ck.same("resamples", int(stats["resamples"]), report["resamples"])
    check_methods(run, report, ck, boot)
    check_pooled(run, report, ck, boot)
    check_discrimination(run, report, ck, boot)
    check_pools(run, report, ck, boot)
    check_removal(run, report, ck, boot)
    check_smc(run, report, ck)
    check_scorer_swap(run, report, ck, boot)


# -- controls ------------------------------------------------------------------------------------


def load_collection(path: Path) -> tuple[dict, list[dict]]:
    from safetensors.numpy import load_file

    meta = json.loads((path / "collect.json").read_text())
    total = int(meta["sampling"]["total_steps"])
    shards: dict[int, dict] = {}
    states = []
    for line in (path / "trajectories.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        t = json.loads(line)
        if t["shard"] not in shards:
            shards[t["shard"]] = load_file(str(path / f"snapshots-{t['shard']:05d}.safetensors"))
        shard = shards[t["shard"]]
        for j in range(t["row"], t["row"] + t["snapshots"]):
            row = shard["tokens"][j]
            step = int(shard["steps"][j])
            states.append(
                {
                    "problem": t["problem"],
                    "tokens": row[row >= 0].astype(np.int64),
                    "prompt_len": int(t["prompt_len"]),
                    "step": step,
                    "label": bool(t["correct"]),
                    "final": step == total,
                    "trajectory": int(t["index"]),
                }
            )
    return meta, states


def score_collection(
    meta: dict, states: list[dict], controls: dict, facts: dict | None = None
) -> tuple[int, dict[str, np.ndarray], dict]:
    """The backbone's mask token and each scorer's score of the stored states (NaN where a
    final-states scorer is not asked), through the plugin registry as a run builds them, in
    rows of 256 in the collection's order. `facts`, when given, receives the backbone's stop
    tokens (`stops`) and each scorer's resolved settings (`settings`: attention, pooling, …;
    {} for a scorer that has none)."""
    import torch

    from dllmbench.api.interfaces import ScoreBatch
    from dllmbench.loading.registry import registry

    reg = registry()
    backbone = reg.backbone(meta["backbone"]["name"], **dict(meta["backbone"]["config"]))
    total = int(meta["sampling"]["total_steps"])
    scores, partial, settings = {}, {}, {}
    for name, entry in controls["scorers"].items():
        scorer = reg.scorer(entry["name"], shared={"backbone": backbone}, **dict(entry["config"]))
        partial[name] = bool(getattr(scorer, "reads_partial", True))
        found = getattr(scorer, "settings", None)
        settings[name] = dict(found) if isinstance(found, Mapping) else {}
        rows = [i for i, s in enumerate(states) if partial[name] or s["final"]]
        out = np.full(len(states), np.nan)
        for start in range(0, len(rows), 256):
            chunk = rows[start : start + 256]
            batch = ScoreBatch(
                [torch.from_numpy(states[i]["tokens"]) for i in chunk],
                [states[i]["prompt_len"] for i in chunk],
                [states[i]["step"] for i in chunk],
                total,
            )
            with torch.no_grad():
                out[chunk] = np.asarray(scorer.score(batch), np.float64)
        scores[name] = out
    if facts is not None:
        facts["stops"] = {int(t) for t in (getattr(backbone, "stop_ids", ()) or ())}
        facts["settings"] = settings
    return int(backbone.mask_id), scores, partial


def check_controls(folder: Path, theirs: dict, ck: Checker, collection: Path | None = None) -> None:
    path = collection or Path(theirs["collection"]["path"])
    meta, states = load_collection(path)
    facts: dict = {}
    mask_id, scores, partial = score_collection(meta, states, theirs, facts)
    total = int(meta["sampling"]["total_steps"])
    for s in states:
        gen = s["tokens"][s["prompt_len"] :]
        s["mask"] = int((gen == mask_id).sum()) / max(gen.size, 1)
    boot = (int(theirs["seed"]), int(theirs["resamples"]), float(theirs["level"]))
    problems = list(dict.fromkeys(s["problem"] for s in states))
    pindex = {p: i for i, p in enumerate(problems)}
    finals = [s for s in states if s["final"]]
    col = theirs["collection"]
    ck.same("controls.collection.problems", len(problems), col["problems"])
    ck.same("controls.collection.states", len(states), col["states"])
    ck.same(
        "controls.collection.correct", r6(np.mean([s["label"] for s in finals])), col["correct"]
    )
    width = min(int(theirs["width"]), int(meta["n"]))
    ck.same("controls.width", width, theirs["width"])
    counts = draw_counts(len(problems), boot[1], boot[0])

    def rows_of(name: str, keep) -> list[tuple]:
        sc = np.nan_to_num(scores[name])
        return [
            (pindex[s["problem"]], float(sc[i]), s["label"], s["mask"])
            for i, s in enumerate(states)
            if keep(s)
        ]

    sliced = [n for n in scores if partial[n]]
    for block in (theirs, theirs["alternative"]):
        slicing = block["slicing"]
        inside = (
            (lambda s: True) if slicing == "paper" else (lambda s: not s["final"] and s["step"] > 0)
        )
        aucs = {a["scorer"]: a for a in block["auc_by_mask"]}
        ck.same(f"controls[{slicing}].auc_scorers", sorted(sliced), sorted(aucs))
        for name in sliced:
            where = f"controls[{slicing}].auc_by_mask[{name}]"
            mine = auc_buckets(rows_of(name, inside), boot)
            for b, tb in zip(mine, aucs[name]["buckets"], strict=True):
                bw = f"{where}[{b['low']:.1f}]"
                for key in ("n", "positives", "auc"):
                    ck.same(f"{bw}.{key}", b[key], tb[key])
                ck.interval(f"{bw}.interval", b["interval"], tb["interval"])
            fin = [(p, s, y, 0.0) for p, s, y, _ in rows_of(name, lambda s: s["final"])]
            fb = auc_buckets(fin, boot)[0]
            tf = aucs[name]["final"]
            for key in ("n", "positives", "auc"):
                ck.same(f"{where}.final.{key}", fb[key], tf[key])
            ck.interval(f"{where}.final.interval", fb["interval"], tf["interval"])
        risks = {(r["scorer"], r["state"], r["keep"]): r for r in block["removal_risk"]}
        mine_keys = []
        for name in sliced:
            sc = np.nan_to_num(scores[name])
            stored = sorted({s["step"] for s in states if slicing == "paper" or s["step"] > 0})
            for which in ("initial", "middle", "final"):
                step = {
                    "initial": stored[0],
                    "final": total,
                    "middle": min(stored, key=lambda x: (abs(x - total / 2), x)),
                }[which]
                at = [i for i, s in enumerate(states) if s["step"] == step]
                n_traj = max(s["trajectory"] for s in states) + 1
                whole_n = (n_traj // width) * width
                groups: dict[tuple[int, int], list[int]] = {}
                for i in at:
                    t = states[i]["trajectory"]
                    if t < whole_n:
                        groups.setdefault((pindex[states[i]["problem"]], t // width), []).append(i)
                whole = np.zeros(len(problems))
                for (p, _), idx in groups.items():
                    whole[p] += len(idx) == width
                for keep in (m for m in (1, 2, 4) if m < width):
                    lost = np.zeros(len(problems))
                    risky = np.zeros(len(problems))
                    for (p, _), idx in groups.items():
                        if len(idx) != width or not any(states[i]["label"] for i in idx):
                            continue
                        best = sorted(idx, key=lambda i: (-sc[i], states[i]["trajectory"]))[:keep]
                        risky[p] += 1
                        lost[p] += not any(states[i]["label"] for i in best)
                    where = f"controls[{slicing}].removal_risk[{name},{which},M={keep}]"
                    mine_keys.append((name, which, keep))
                    t = risks.get((name, which, keep))
                    if t is None:
                        ck.same(where, "present", None)
                        continue
                    ck.same(f"{where}.step", step, t["step"])
                    ck.same(
                        f"{where}.mask_ratio",
                        r6(np.mean([states[i]["mask"] for i in at])),
                        t["mask_ratio"],
                    )
                    ck.same(f"{where}.groups", int(whole.sum()), t["groups"])
                    ck.same(f"{where}.at_risk", int(risky.sum()), t["at_risk"])
                    ck.same(f"{where}.lost", int(lost.sum()), t["lost"])
                    ck.interval(
                        f"{where}.rate", ratio(list(lost), list(risky), counts, boot[2]), t["rate"]
                    )
                    ck.interval(
                        f"{where}.rate_all_groups",
                        ratio(list(lost), list(whole), counts, boot[2]),
                        t["rate_all_groups"],
                    )
        ck.same(f"controls[{slicing}].removal_risk.entries", sorted(mine_keys), sorted(risks))
    taus = {t["scorer"]: t for t in theirs["kendall_tau"]}
    for name in scores:
        mk = kendall(rows_of(name, lambda s: s["final"]), boot)
        for key in ("median", "mean", "problems", "undefined"):
            ck.same(f"controls.kendall_tau[{name}].{key}", mk[key], taus[name][key])
        ck.interval(
            f"controls.kendall_tau[{name}].interval", mk["interval"], taus[name]["interval"]
        )
    # the scorer swap over the fully decoded states, trajectory order
    pools = []
    for p in problems:
        idx = sorted(
            (i for i, s in enumerate(states) if s["final"] and s["problem"] == p),
            key=lambda i: states[i]["trajectory"],
        )
        pools.append(
            [
                ({n: float(np.nan_to_num(scores[n])[i]) for n in scores}, states[i]["label"])
                for i in idx
            ]
        )
    acc, diffs = swap_entries(pools, list(scores), boot)
    ck.same("controls.scorer_swap.size", min(len(p) for p in pools), theirs["scorer_swap"]["size"])
    check_swap_section("controls.scorer_swap", acc, diffs, theirs["scorer_swap"], ck)
    check_reranker(pools, list(scores), scores, finals, boot, theirs["reranker"], ck)
    labels = np.array([s["label"] for s in states])
    cluster = np.array([pindex[s["problem"]] for s in states])

    def auc_change(a: np.ndarray, b: np.ndarray, keep: np.ndarray) -> tuple[dict, dict, dict]:
        """ROC-AUC of scores a and b over the states `keep` and the change b − a, each with
        its interval from the same draws (problem draw counts as state weights)."""
        y, weights = labels[keep], counts[:, cluster[keep]].astype(float)
        values, draws = [], []
        for sc in (a[keep], b[keep]):
            values.append(weighted_auc(sc, y, np.ones(int(keep.sum()))))
            draws.append(weighted_aucs(sc, y, weights))
        return (
            percentile(draws[0], values[0], boot[2]),
            percentile(draws[1], values[1], boot[2]),
            percentile(draws[1] - draws[0], values[1] - values[0], boot[2]),
        )

    everything = np.ones(len(states), bool)
    ablated = score_ablated(meta, states, theirs, partial, mask_id)
    got = {e["scorer"]: e for e in theirs["suffix_ablation"]}
    ck.same("controls.suffix_ablation.scorers", sorted(ablated), sorted(got))
    for name, changed in ablated.items():
        where = f"controls.suffix_ablation[{name}]"
        original, after, change = auc_change(scores[name], changed, everything)
        ck.same(f"{where}.n", len(states), got[name]["n"])
        ck.interval(f"{where}.original", original, got[name]["original"])
        ck.interval(f"{where}.ablated", after, got[name]["ablated"])
        ck.interval(f"{where}.change", change, got[name]["change"])
    settings = facts["settings"]
    check_readout(settings, scores, np.array([s["final"] for s in states]), auc_change, theirs, ck)
    flipped = score_reversed(meta, states, theirs, facts["stops"], settings)
    check_reversed(settings, scores, flipped, auc_change, theirs, ck)


def same_but(a: dict, b: dict, key: str) -> bool:
    return {k: v for k, v in a.items() if k != key} == {k: v for k, v in b.items() if k != key}


def check_readout(settings, scores, final, auc_change, theirs, ck: Checker) -> None:
    """Every (mean, last) pair of scorers whose settings differ only in `pooling`: the
    fully decoded states' ROC-AUC of each and the paired change last − mean."""
    pairs = [
        (a, b)
        for a in sorted(settings)
        for b in sorted(settings)
        if settings[a]
        and settings[a].get("pooling") == "mean"
        and settings[b].get("pooling") == "last"
        and same_but(settings[a], settings[b], "pooling")
    ]
    got = theirs["readout"]
    ck.same("controls.readout.pairs", pairs, [(e["mean"], e["last"]) for e in got])
    for (mean, last), t in zip(pairs, got, strict=False):
        where = f"controls.readout[{mean},{last}]"
        ck.same(f"{where}.attention", settings[mean].get("attention"), t["attention"])
        ck.same(f"{where}.n", int(final.sum()), t["n"])
        a, b, change = auc_change(scores[mean], scores[last], final)
        ck.interval(f"{where}.mean_auc", a, t["mean_auc"])
        ck.interval(f"{where}.last_auc", b, t["last_auc"])
        ck.interval(f"{where}.change", change, t["change"])


def reverse_solution(tokens: np.ndarray, prompt_len: int, stops: set[int]) -> np.ndarray:
    """The generated tokens before the first stop token in reverse order; the prompt and
    everything from the first stop token on in place."""
    out = tokens.copy()
    gen = tokens[prompt_len:]
    hits = [i for i, t in enumerate(gen.tolist()) if t in stops]
    end = hits[0] if hits else gen.size
    out[prompt_len : prompt_len + end] = gen[:end][::-1]
    return out


def score_reversed(meta, states, controls, stops, settings) -> dict[str, np.ndarray]:
    """Each causal scorer on the states it scores with the solution reversed."""
    names = [n for n in controls["scorers"] if settings[n].get("attention") == "causal"]
    if not names:
        return {}
    changed = [
        {**s, "tokens": reverse_solution(s["tokens"], s["prompt_len"], stops)} for s in states
    ]
    _, out, _ = score_collection(
        meta, changed, {"scorers": {n: controls["scorers"][n] for n in names}}
    )
    return out


def check_reversed(settings, scores, flipped, auc_change, theirs, ck: Checker) -> None:
    """Each causal scorer forward, reversed and averaged over the states it scored, and the
    averaged score against the first (by name) bidirectional scorer of the same other
    settings."""
    got = {e["scorer"]: e for e in theirs["reversed_input"]}
    ck.same("controls.reversed_input.scorers", sorted(flipped), sorted(got))
    for name, backward in flipped.items():
        where = f"controls.reversed_input[{name}]"
        t = got.get(name)
        if t is None:
            continue
        keep = ~np.isnan(scores[name])
        averaged = (scores[name] + backward) / 2.0
        forward, back, _ = auc_change(scores[name], backward, keep)
        ck.same(f"{where}.n", int(keep.sum()), t["n"])
        ck.interval(f"{where}.forward", forward, t["forward"])
        ck.interval(f"{where}.reversed", back, t["reversed"])
        ck.interval(f"{where}.averaged", auc_change(scores[name], averaged, keep)[1], t["averaged"])
        reference = next(
            (
                other
                for other in sorted(settings)
                if settings[other].get("attention") == "bidirectional"
                and same_but(settings[name], settings[other], "attention")
            ),
            None,
        )
        tr = t["reference"]
        ck.same(f"{where}.reference.scorer", reference, tr and tr["scorer"])
        if reference is None or tr is None:
            continue
        auc, _, gap = auc_change(scores[reference], averaged, keep)
        ck.interval(f"{where}.reference.auc", auc, tr["auc"])
        ck.interval(f"{where}.reference.gap", gap, tr["gap"])


def score_ablated(meta, states, controls, partial, mask_id) -> dict[str, np.ndarray]:
    """Each partial-state scorer on every stored state with the right half of the generated
    region (from prompt length + ⌈G/2⌉) set to the mask token."""
    changed = []
    for s in states:
        t = s["tokens"].copy()
        g = t.size - s["prompt_len"]
        t[s["prompt_len"] + (g + 1) // 2 :] = mask_id
        changed.append({**s, "tokens": t})
    names = [n for n in controls["scorers"] if partial[n]]
    _, out, _ = score_collection(
        meta, changed, {"scorers": {n: controls["scorers"][n] for n in names}}
    )
    return out


def check_reranker(pools, names, scores, finals, boot, theirs, ck: Checker) -> None:
    got = {e["scorer"]: e for e in theirs}
    pools = [p for p in pools if p]
    n = min(len(p) for p in pools)
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= 2
    sizes.append(n)
    for name in names:
        where = f"controls.reranker[{name}]"
        t = got[name]
        for point, tp in zip(sizes, t["points"], strict=True):
            best, uniform = [], []
            for pool in pools:
                cut = pool[:n]
                order = sorted(range(n), key=lambda j: (-cut[j][0][name], j))
                ways = sum(
                    math.comb(n - 1 - r, point - 1) for r, j in enumerate(order) if cut[j][1]
                )
                best.append(ways / math.comb(n, point))
                uniform.append(sum(c for _, c in cut) / n)
            ck.same(f"{where}.n", point, tp["n"])
            ck.interval(f"{where}@{point}.scorer", mean_interval(best, boot), tp["scorer"])
            ck.interval(f"{where}@{point}.random", mean_interval(uniform, boot), tp["random"])
            ck.interval(
                f"{where}@{point}.difference", paired(best, uniform, boot), tp["difference"]
            )
        sc = [(c[0][name], c[1]) for pool in pools for c in pool]
        right = [v for v, y in sc if y]
        wrong = [v for v, y in sc if not y]
        ck.same(f"{where}.mean_correct", r6(np.mean(right)) if right else None, t["mean_correct"])
        ck.same(
            f"{where}.mean_incorrect", r6(np.mean(wrong)) if wrong else None, t["mean_incorrect"]
        )
        gaps = []
        for pool in pools:
            ys = [y for _, y in pool]
            if 0 < sum(ys) < len(ys):
                a = np.mean([c[0][name] for c in pool if c[1]])
                b = np.mean([c[0][name] for c in pool if not c[1]])
                gaps.append(a - b)
        ck.same(
            f"{where}.separated",
            r6(np.mean([g > 0 for g in gaps])) if gaps else None,
            t["separated"],
        )
        ck.same(f"{where}.mixed", len(gaps), t["mixed"])


# -- entry point --------------------------------------------------------------------------------


def recompute(
    run_dir: Path,
    report_file: Path | None = None,
    controls_dir: Path | None = None,
    collection: Path | None = None,
    verbose: bool = False,
) -> Checker:
    """Compare every covered number of the report (and the controls) with a recomputation."""
    ck = Checker(verbose)
    report = json.loads((report_file or run_dir / "report" / "report.json").read_text())
    check_run(run_dir, report, ck)
    if controls_dir is not None:
        controls = json.loads((controls_dir / "controls.json").read_text())
        check_controls(controls_dir, controls, ck, collection)
        if report.get("controls") is not None:
            ck.same("report.controls == controls.json", report["controls"] == controls, True)
    return ck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--report", type=Path, help="report.json (default RUN_DIR/report/report.json)"
    )
    parser.add_argument("--controls", type=Path, help="a folder holding controls.json")
    parser.add_argument(
        "--collection", type=Path, help="the collection (default: controls.json's path)"
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only differences and the summary"
    )
    args = parser.parse_args(argv)
    ck = recompute(
        args.run_dir, args.report, args.controls, args.collection, verbose=not args.quiet
    )
    for what in ck.uncovered:
        print(f"not recomputed: {what}")
    bad = ck.differences
    print(
        f"{len(ck.compared)} numbers compared, {len(bad)} differ, "
        f"{len(ck.uncovered)} not recomputed"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
