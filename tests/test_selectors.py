"""Unit tests of the built-in selectors (first, argmax, random, majority, weighted_majority,
oracle), built through the registry as the harness builds them."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle

import numpy as np
import pytest

from dllmbench.core.errors import PluginError
from dllmbench.core.types import Candidate
from dllmbench.loading.registry import registry
from dllmbench.testing.helpers import make_candidates


def cands(
    keys: list[object | None],
    *,
    orm: list[float] | None = None,
    prm: list[float] | None = None,
    weights: list[float | None] | None = None,
) -> list[Candidate]:
    """Candidates whose answer key is keys[i] (None: extraction failed)."""
    out = []
    for i, key in enumerate(keys):
        scores = {}
        if orm is not None:
            scores["orm"] = orm[i]
        if prm is not None:
            scores["prm"] = prm[i]
        out.append(
            Candidate(
                index=i,
                text="" if key is None else f"answer {key}",
                answer=None if key is None else str(key),
                answer_key=key,
                lineage=(i,),
                scores=scores,
                weight=None if weights is None else weights[i],
            )
        )
    return out


def select(name: str, candidates: list[Candidate], *, labels=None, seed: int = 0, **config):
    selector = registry().selector(name, **config)
    return selector.select(candidates, rng=np.random.default_rng(seed), labels=labels)


# -- majority -----------------------------------------------------------------------------------


def test_majority_is_plurality():
    assert select("majority", cands([7, 4, 4, 9, 4, 7])) == 1
    assert select("majority", cands([1, 2, 3, 3])) == 2


def test_majority_returns_first_holder_of_the_winner():
    assert select("majority", cands([9, 5, 8, 5, 5])) == 1


def test_majority_invalid_never_votes():
    # None is the most frequent "answer" but does not vote
    assert select("majority", cands([None, None, None, 4, 7, 4])) == 3
    assert select("majority", cands([None, None, 6])) == 2


def test_majority_tie_goes_to_answer_appearing_first():
    assert select("majority", cands([7, 4, 4, 7])) == 0
    assert select("majority", cands([None, 3, 8, 8, 3])) == 1
    assert select("majority", cands([2, 5, 9])) == 0


def test_majority_all_invalid_or_empty_is_none():
    assert select("majority", cands([None, None, None])) is None
    assert select("majority", []) is None


def test_majority_drops_invalid_answers_by_default():
    selector = registry().selector("majority")
    assert dataclasses.asdict(selector.config) == {"invalid": "drop"}
    c = cands([None, None, None, 4, 7, 4])
    assert select("majority", c) == select("majority", c, invalid="drop") == 3


def test_majority_invalid_vote_bloc_wins_and_is_wrong():
    # three failed extractions outvote two 4s: the choice is None, which counts as wrong
    assert select("majority", cands([None, 4, None, 4, None]), invalid="vote") is None
    assert select("majority", cands([None, None, None]), invalid="vote") is None
    # with fewer invalid answers than the leading answer, the leading answer wins as before
    assert select("majority", cands([None, 4, 7, 4, None, 4]), invalid="vote") == 1


def test_majority_invalid_vote_ties_go_to_the_first_seen():
    # invalid bloc and 4 both have two votes; the bloc appears first
    assert select("majority", cands([None, 4, 4, None]), invalid="vote") is None
    # 4 appears first
    assert select("majority", cands([4, None, None, 4]), invalid="vote") == 0
    # three-way tie, 9 first seen at index 1 after the bloc's index 0: the bloc
    assert select("majority", cands([None, 9, 2]), invalid="vote") is None
    assert select("majority", cands([9, None, 2]), invalid="vote") == 0
    # the same pools with invalid=drop: the bloc never votes
    assert select("majority", cands([None, 4, 4, None])) == 1
    assert select("majority", cands([None, 9, 2])) == 1


def test_majority_invalid_vote_matches_counter_most_common():
    """The paper's count: Counter over answers with failed extraction as the string "None",
    most_common(1) (ties to the first seen); the pick is that answer's first candidate."""
    from collections import Counter

    rng = np.random.default_rng(5)
    for _ in range(300):
        keys = [None if rng.random() < 0.35 else int(rng.integers(0, 3)) for _ in range(7)]
        answers = ["None" if k is None else str(k) for k in keys]
        top = Counter(answers).most_common(1)[0][0]
        expected = None if top == "None" else answers.index(top)
        assert select("majority", cands(keys), invalid="vote") == expected, keys


def test_majority_invalid_option_is_checked():
    with pytest.raises(PluginError):
        registry().selector("majority", invalid="count")


# -- weighted_majority --------------------------------------------------------------------------


def test_weighted_majority_orm_differs_from_plain_majority():
    keys = [5, 5, 9]
    orm = [-3.0, -3.0, 4.0]  # sigmoid: 2 × 0.047 against 0.982
    assert select("majority", cands(keys, orm=orm)) == 0
    assert select("weighted_majority", cands(keys, orm=orm), by="orm") == 2


def test_weighted_majority_orm_sums_sigmoids_not_raw_scores():
    # sigmoid: 2 × 0.731 = 1.46 > 0.953 → answer 5; raw sums (2 < 3) or exp (5.4 < 20.1)
    # would pick 9 instead.
    keys = [5, 5, 9]
    orm = [1.0, 1.0, 3.0]
    assert select("weighted_majority", cands(keys, orm=orm), by="orm") == 0
    # and flipping the margin flips the answer: 2 × sigmoid(−1) = 0.54 < sigmoid(3)
    assert select("weighted_majority", cands(keys, orm=[-1.0, -1.0, 3.0]), by="orm") == 2


def test_weighted_majority_reads_the_named_scorer():
    keys = [5, 9]
    c = cands(keys, orm=[5.0, -5.0], prm=[-5.0, 5.0])
    assert select("weighted_majority", c, by="orm") == 0
    assert select("weighted_majority", c, by="prm") == 1


def test_weighted_majority_invalid_never_votes():
    c = cands([None, 3, 4], orm=[50.0, -1.0, -2.0])
    assert select("weighted_majority", c, by="orm") == 1
    assert select("weighted_majority", cands([None, None], orm=[1.0, 2.0]), by="orm") is None


def test_weighted_majority_tie_goes_to_answer_appearing_first():
    c = cands([8, 3, 3, 8], orm=[0.0, 0.0, 0.0, 0.0])
    assert select("weighted_majority", c, by="orm") == 0


def test_weighted_majority_by_weight_uses_candidate_weights():
    keys = [5, 5, 9]
    assert select("weighted_majority", cands(keys, weights=[0.2, 0.2, 0.6]), by="weight") == 2
    assert select("weighted_majority", cands(keys, weights=[0.3, 0.3, 0.4]), by="weight") == 0
    # weights of invalid candidates are not counted
    c = cands([None, 1, 2], weights=[0.9, 0.04, 0.06])
    assert select("weighted_majority", c, by="weight") == 2


def test_weighted_majority_by_weight_without_weights_raises():
    with pytest.raises(ValueError):
        select("weighted_majority", cands([1, 2, 3]), by="weight")
    with pytest.raises(ValueError):
        select("weighted_majority", cands([1, 2], weights=[0.5, None]), by="weight")


# -- argmax, first, random ----------------------------------------------------------------------


def test_argmax_picks_highest_score_of_its_scorer():
    c = cands([1, 2, 3, 4], orm=[0.3, -1.0, 2.5, 0.0], prm=[0.1, 0.9, -0.4, 0.2])
    assert select("argmax", c, scorer="orm") == 2
    assert select("argmax", c, scorer="prm") == 1
    assert select("argmax", c) == 2  # default scorer: orm


def test_argmax_ignores_validity():
    c = cands([None, 2], prm=[3.0, 1.0])
    assert select("argmax", c, scorer="prm") == 0


def test_argmax_ties_go_to_lowest_index():
    c = cands([1, 2, 3, 4], prm=[0.1, 0.9, 0.9, 0.9])
    assert select("argmax", c, scorer="prm") == 1


def test_argmax_nan_raises():
    c = cands([1, 2, 3], prm=[0.1, math.nan, 0.3])
    with pytest.raises(ValueError):
        select("argmax", c, scorer="prm")


def test_argmax_empty_is_none():
    assert select("argmax", [], scorer="prm") is None


def test_first_returns_zero_and_none_when_empty():
    assert select("first", cands([None, 3, 3])) == 0
    assert select("first", cands([8])) == 0
    assert select("first", []) is None


def test_random_uses_the_given_rng():
    c = cands([1, 2, 3, 4, 5])
    picks = [select("random", c, seed=s) for s in range(200)]
    assert all(isinstance(p, int) and 0 <= p < 5 for p in picks)
    assert set(picks) == set(range(5))
    assert picks == [select("random", c, seed=s) for s in range(200)]
    # two generators in the same state give the same pick; one selector, consecutive draws,
    # read the generator's state rather than a fixed seed of their own
    selector = registry().selector("random")
    rng = np.random.default_rng(99)
    draws = [selector.select(c, rng=rng) for _ in range(50)]
    assert len(set(draws)) > 1
    rng = np.random.default_rng(99)
    assert draws == [selector.select(c, rng=rng) for _ in range(50)]


def test_random_empty_is_none():
    assert select("random", []) is None


# -- oracle -------------------------------------------------------------------------------------


def test_oracle_is_a_ceiling_and_picks_first_correct():
    assert registry().selector("oracle").ceiling is True
    c = cands([1, 2, 3, 4])
    assert select("oracle", c, labels=[False, False, True, True]) == 2
    assert select("oracle", c, labels=[True, False, False, True]) == 0


def test_oracle_without_a_correct_candidate_picks_a_wrong_one():
    labels = [False, False, False]
    chosen = select("oracle", cands([1, 2, 3]), labels=labels)
    assert chosen is None or (0 <= chosen < 3 and labels[chosen] is False)


def test_oracle_needs_labels():
    with pytest.raises(ValueError):
        select("oracle", cands([1, 2]))


# -- declarations and configuration -------------------------------------------------------------


def test_selector_needs():
    reg = registry()
    assert reg.selector("argmax", scorer="prm").needs == ("prm",)
    assert reg.selector("argmax").needs == ("orm",)
    assert reg.selector("weighted_majority", by="weight").needs == ()
    assert reg.selector("weighted_majority", by="orm").needs == ("orm",)
    for name in ("first", "random", "majority", "oracle"):
        assert reg.selector(name).needs == (), name


def test_only_oracle_is_a_ceiling():
    reg = registry()
    for name in ("first", "random", "majority", "argmax", "weighted_majority"):
        assert reg.selector(name).ceiling is False, name


def test_unknown_option_raises_plugin_error():
    with pytest.raises(PluginError, match="foo"):
        registry().selector("argmax", foo=1)
    with pytest.raises(PluginError):
        registry().selector("majority", by="orm")


def test_unknown_selector_raises_plugin_error():
    with pytest.raises(PluginError, match="no_such_selector"):
        registry().selector("no_such_selector")


# -- what a selector receives ------------------------------------------------------------------


def test_candidates_are_read_only_yet_copy_and_pickle_as_before():
    """Candidates are frozen with read-only scores (a selector cannot change what it was
    given), and still pickle, copy (deep too) and record as plain data."""
    [cand] = make_candidates(["4"], scores={"orm": [0.5]}, weights=[0.25])
    with pytest.raises(TypeError):
        cand.scores["orm"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cand.index = 3  # type: ignore[misc]
    for copied in (pickle.loads(pickle.dumps(cand)), copy.deepcopy(cand), copy.copy(cand)):
        assert copied == cand and copied.scores == {"orm": 0.5}
        with pytest.raises(TypeError):
            copied.scores["orm"] = 1.0  # type: ignore[index]
    assert json.loads(json.dumps(dict(cand.scores))) == {"orm": 0.5}
    assert json.loads(json.dumps(cand.scores)) == {"orm": 0.5}
    assert dataclasses.asdict(cand)["scores"] == {"orm": 0.5}  # a selector may log it
    for change in (
        lambda: cand.scores.update(orm=1.0),
        lambda: cand.scores.pop("orm"),
        lambda: cand.scores.setdefault("prm", 0.0),
        lambda: cand.scores.clear(),
    ):
        with pytest.raises(TypeError):
            change()
    assert cand.scores == {"orm": 0.5}
    mine = {"orm": 0.5}
    built = Candidate(0, "", None, None, [0], mine)
    mine["orm"] = 2.0  # the caller's dict is copied, not shared
    assert built.scores == {"orm": 0.5} and built.lineage == (0,)
