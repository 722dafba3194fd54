"""How often a run decoded with an approximate cache answers as exact decoding does.

Fast-dLLM's prefix and dual caches refresh the keys and values once per block, so a cached
run's samples may differ from the model's own. `dllmbench report RUN --exact EXACT_RUN` sets
each method of RUN beside the same method of an exact run of the same protocol: the rows of a
method draw the same noise in both (keys come from the seed, the problem and the row's
lineage), so any difference is the cache's. Per method, over the problems both runs hold:
the share whose selected answer is the exact run's (compared as the task keys answers, an
invalid answer equal only to an invalid one), the share of candidates, matched by lineage,
whose answer is, and both accuracies.
"""

from __future__ import annotations

from typing import Any

from dllmbench.analysis import evidence
from dllmbench.core.errors import UserError
from dllmbench.core.schema import AgreementEntry, AgreementMethod

# the manifest keys two runs must share, the backbone's options apart
SAME = ("task", "sampling")


def _selected_key(record: dict[str, Any]) -> str | None:
    chosen = record.get("selected")
    return None if chosen is None else record["candidates"][chosen].get("key")


def agreement(run: evidence.RunData, exact: evidence.RunData) -> AgreementEntry:
    """The agreement of `run`'s methods with `exact`'s (same ids), refused in one line when
    the two runs are not of one protocol or `exact` is itself approximate."""
    for key in SAME:
        if run.manifest.get(key) != exact.manifest.get(key):
            raise UserError(
                f"{exact.path} is not an exact run of {run.path}'s protocol: their {key} "
                "differs; run it with the same task, problems, sampling and seed"
            )
    if run.manifest["backbone"]["name"] != exact.manifest["backbone"]["name"]:
        raise UserError(
            f"{exact.path} runs backbone {exact.manifest['backbone']['name']!r}, "
            f"not {run.manifest['backbone']['name']!r}; give an exact run of the same backbone"
        )
    if any(m.get("approximate") for m in exact.manifest["methods"]):
        raise UserError(f"{exact.path} is decoded with an approximate cache; give an exact run")
    methods = []
    for method, records in run.by_method.items():
        theirs = exact.by_method.get(method)
        if not theirs:
            continue
        both = [p for p in records if p in theirs]
        if not both:
            continue
        same = sum(_selected_key(records[p]) == _selected_key(theirs[p]) for p in both)
        pairs = 0
        equal = 0
        for p in both:
            exact_keys = {tuple(c["lineage"]): c.get("key") for c in theirs[p]["candidates"]}
            for c in records[p]["candidates"]:
                lineage = tuple(c["lineage"])
                if lineage in exact_keys:
                    pairs += 1
                    equal += c.get("key") == exact_keys[lineage]
        methods.append(
            AgreementMethod(
                id=method,
                problems=len(both),
                same_answer=same / len(both),
                candidates=pairs,
                same_candidate=None if not pairs else equal / pairs,
                accuracy=sum(bool(records[p]["correct"]) for p in both) / len(both),
                exact_accuracy=sum(bool(theirs[p]["correct"]) for p in both) / len(both),
            )
        )
    if not methods:
        raise UserError(
            f"{exact.path} holds none of {run.path}'s methods on its problems; run the same "
            "methods exactly"
        )
    return AgreementEntry(exact_run=str(exact.path), methods=methods)
