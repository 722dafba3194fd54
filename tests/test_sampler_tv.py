"""benchmarks/sampler_tv.py: its TV statistic, noise floor and reference draw are right."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sampler_tv.py"


def load_script():
    spec = importlib.util.spec_from_file_location("sampler_tv", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sampler_tv", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tvmod = load_script()


def law(vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.softmax(2 * logits, -1)


def test_tv_by_hand():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    counts = torch.tensor([6, 1, 1])  # 0.75, 0.125, 0.125
    assert math.isclose(tvmod.tv(counts, p), 0.25)
    head = torch.tensor([0])
    assert math.isclose(tvmod.tv(tvmod.merge_tail(counts, head), tvmod.merge_tail(p, head)), 0.25)


def test_expected_tv_is_de_moivre():
    """The closed form against the binomial sum, and the large-N form where N·p is large."""
    n = 30
    p = torch.tensor([0.01, 0.2, 0.5, 0.77], dtype=torch.float64)
    k = torch.arange(n + 1, dtype=torch.float64)
    brute = 0.0
    for pi in p.tolist():
        pmf = torch.exp(
            math.lgamma(n + 1)
            - torch.lgamma(k + 1)
            - torch.lgamma(n - k + 1)
            + k * math.log(pi)
            + (n - k) * math.log1p(-pi)
        )
        brute += 0.5 * (pmf * (k / n - pi).abs()).sum().item()
    assert math.isclose(tvmod.expected_tv(p, n), brute, rel_tol=1e-9)
    big = torch.tensor([0.3, 0.7], dtype=torch.float64)
    assert math.isclose(
        tvmod.expected_tv(big, 10**6), tvmod.expected_tv_large_n(big, 10**6), rel_tol=1e-3
    )


def test_exact_draws_sit_at_the_floor_and_a_biased_sampler_at_its_bias():
    p, n = law(), 200_000
    gen = torch.Generator().manual_seed(1)
    floor = tvmod.expected_tv(p, n)
    measured = tvmod.tv(tvmod.exact_counts(p, n, gen, chunk=1 << 16), p)
    assert 0.9 * floor < measured < 1.1 * floor
    # mix in 5% of a point mass at the least likely token j: TV(q, p) = ε (1 − p_j) exactly
    eps, j = 0.05, p.argmin()
    q = (1 - eps) * p
    q[j] += eps
    bias = eps * (1 - p[j].item())
    measured = tvmod.tv(tvmod.exact_counts(q, n, gen, chunk=1 << 16), p)
    # |TV(counts, p) − TV(q, p)| ≤ TV(counts, q), whose mean is q's floor
    assert abs(measured - bias) < 2 * tvmod.expected_tv(q, n)
    assert measured > bias / 2


def test_the_reference_draw_is_categorical_sample_and_an_exponential_race():
    """reference_counts draws what Categorical(probs).sample() draws from the same stream, and
    that is argmax(probs / Exp(1)) in the probabilities' dtype."""
    logits = (3 * torch.randn(500, generator=torch.Generator().manual_seed(2))).bfloat16()
    probs = torch.softmax(logits[None] / 0.5, -1).expand(64, -1)
    torch.manual_seed(3)
    expected = torch.distributions.Categorical(probs=probs).sample()
    torch.manual_seed(3)
    counts, fallbacks = tvmod.reference_counts(logits, 0.5, 64, torch.default_generator, 64)
    assert fallbacks == 0
    assert torch.equal(counts, torch.bincount(expected, minlength=500))
    torch.manual_seed(3)
    normalised = probs / probs.sum(-1, keepdim=True)
    q = torch.empty_like(normalised).exponential_(1)
    assert q.dtype == torch.bfloat16
    assert torch.equal(torch.argmax(normalised / q, -1), expected)


def test_script_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "tv.json"
    argv = ["--vocab", "2000", "--draws", "2000", "--chunk", "1000", "--shape", "peaked", "flat"]
    report = tvmod.main([*argv, "--json", str(out)])
    assert json.loads(out.read_text()) == report
    assert len(report["results"]) == 2 * 2 * 2  # dtypes × shapes × temperatures
    for r in report["results"]:
        assert set(r["samplers"]) == {"reference", "dllmbench", "exact"}
        for s in r["samplers"].values():
            assert 0 <= s["tv_head"] <= s["tv"] + 1e-12 <= 1
    assert "reference" in capsys.readouterr().out
