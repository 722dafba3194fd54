"""The built-in method families: the paper's methods and the published dLLM test-time methods
(HEX, ReMDM, Prism-style search, sampler ensembles, Adaptive-Consistency, confidence-threshold
decoding), each a spec with a free size and a label.

They register through the same hook as a third-party package's families.
"""

from __future__ import annotations

from dllmbench.api.hookspecs import RegisterFamily, hookimpl

# name, leaderboard label (formatted with the strategy's configuration), spec ("{half}": T // 2,
# "{quarter}": T // 4). ReMDM's loop schedule is a spec away:
# --method 'remdm:n=*,schedule=loop,extra=6+majority'.
FAMILIES = (
    ("vanilla", "Vanilla", "independent:n=1+first"),
    ("majority", "Majority@{n}", "independent:n=*+majority"),
    ("orm_rerank", "ORM Rerank@{n}", "independent:n=*+argmax:scorer=orm"),
    ("weighted_majority", "Weighted Majority@{n}", "independent:n=*+weighted_majority:by=orm"),
    ("prm_rerank", "PRM Rerank@{n}", "independent:n=*+argmax:scorer=prm"),
    ("random_rerank", "Random Rerank@{n}", "independent:n=*+random"),
    (
        "prm_guided",
        "PRM Guided K={k} b={every}",
        "prm_guided:k=*,every={half},final=keep+argmax:scorer=prm",
    ),
    ("top_m", "Top-{keep} Retention K={k} b={every}", "prm_guided:k=*,every={half},keep=2+first"),
    (
        "prm_hybrid",
        "PRM Hybrid K={k} b={every} + Majority",
        "prm_guided:k=*,every={half},final=keep+majority",
    ),
    (
        "smc_vote",
        "SMC K={k} b={every} (weighted vote)",
        "smc:k=*,every={half}+weighted_majority:by=weight",
    ),
    ("smc_top", "SMC K={k} b={every} (top particle)", "smc:k=*,every={half}+argmax:scorer=prm"),
    ("hex", "HEX@{n}", "hex:n=*+majority"),
    ("ensemble", "Sampler Ensemble@{n}", "ensemble:n=*+majority"),
    ("remdm", "ReMDM-cap@{n}", "remdm:n=*,schedule=cap+majority"),
    ("remdm_orm", "ReMDM-cap@{n} + ORM Rerank", "remdm:n=*,schedule=cap+argmax:scorer=orm"),
    ("prism", "Prism N={n} K={final}", "prism:n=*,final=4,survivors=2,scorer=self+majority"),
    ("adaptive_consistency", "Adaptive-Consistency ≤{n}", "adaptive:n=*+majority"),
    ("threshold", "Threshold τ={threshold} Majority@{n}", "threshold:n=*,threshold=0.9+majority"),
    ("oracle", "Oracle@{n}", "independent:n=*+oracle"),
    (
        "hybrid_oracle",
        "Oracle of PRM Hybrid K={k} b={every}",
        "prm_guided:k=*,every={half},final=keep+oracle",
    ),
)


@hookimpl
def dllmbench_register_methods(register: RegisterFamily) -> None:
    for name, label, spec in FAMILIES:
        register(name, spec=spec, label=label)
