"""The contract kit on this package's plugins, and tests of their own behaviour."""

import numpy as np
from dllmbench_example import Best

from dllmbench.testing import make_candidates, run_strategy
from dllmbench.testing.contracts import *  # noqa: F403  (the kit: every check, parametrised)


def test_best_picks_the_valid_candidate_with_the_highest_score():
    candidates = make_candidates(["4", None, "7", "9"], scores={"orm": [0.1, 5.0, 0.8, 0.8]})
    assert Best().select(candidates, rng=np.random.default_rng(0)) == 2
    assert Best().select(make_candidates([None]), rng=np.random.default_rng(0)) is None


def test_resample_on_the_toy_task():
    records = run_strategy("example_resample:k=3,every=4+example_best", steps=16)
    assert len(records) == 5
    for record in records:
        assert record["ledger"]["passes"] == {"denoise": 48, "score:orm": 3, "score:prm": 12}
        assert len(record["candidates"]) == 3
        assert all("prm" in c["scores"] for c in record["candidates"])
