"""How far the reference Dream token draw is from its exact law, in total variation.

Dream's reference `sample_tokens` draws a token per masked position with
`torch.distributions.Categorical(probs=softmax(logits / T)).sample()`, everything in the
logits' dtype (bf16 on a GPU). `Categorical` divides the probabilities by their sum in that
dtype and `sample()` calls `torch.multinomial(probs, 1, True)`; for one sample per row
PyTorch's multinomial is an exponential race, `argmax(probs / q)` with
`q = empty_like(probs).exponential_(1)`, again in the probabilities' dtype (ties go to the
first index). A `Categorical` that raises (its simplex check failed) makes the reference
take the argmax instead (a bare `except`); this script does the same and counts it.

For each logit shape, temperature and dtype this script draws N tokens from one row of
logits over the whole vocabulary, exactly as the reference does (the row repeated in chunks
of `--chunk` rows, each chunk one `multinomial` call, so memory stays bounded), counts them
over V and reports the total-variation distance TV = ½ Σ |count/N − p64| to the exact law
p64 = softmax(logits.double() / T) of the same (dtype-rounded) logits. Beside it:

- `exact`: the same statistic for N draws from p64 itself (`torch.multinomial` on float64
  probabilities), the sampling-noise floor a perfect sampler reaches at this N;
- `E floor`: that floor's expectation, ½ Σ E|X_i/N − p_i| with X_i ~ Binomial(N, p_i),
  computed exactly (de Moivre's mean absolute deviation; the large-N form
  ½ Σ sqrt(2 p (1 − p) / (π N)) is in the JSON too, it overstates the floor where N·p < 1);
- `dllmbench`: dllmbench's own draw, `plugins/backbones/dream.py:sample_tokens`, an
  inverse-CDF draw in float64 (one float64 uniform per draw, here from a seeded generator;
  in a run they come from the row's key);
- `head` columns: the same TV after merging every token outside the 64 most likely (by
  p64) into one bin. It is a lower bound on the full TV with a much lower noise floor, so a
  bias among the likely tokens shows up at an N where the full-vocabulary floor hides it;
- `round`: the TV between p64 and the dtype's normalised probabilities themselves (no
  sampling): what an exact draw from the rounded probabilities would be off by.

Logits (seeded, float64, then rounded to the dtype as a model's output would be): a tail of
V i.i.d. N(0, 2²) logits, and 8 candidate tokens at random ids with logits
offset − gap·j (j = 0..7), the offset found by bisection so that the top-1 probability at
T = 1 is the shape's target: `peaked` (gap 3, top-1 0.9), `medium` (gap 0.7, top-1 0.4),
`flat` (gap 0.3, top-1 0.05, most of the mass in the long tail).

    python benchmarks/sampler_tv.py --device cpu --draws 6144 --chunk 2048 --json tv_cpu.json
    python benchmarks/sampler_tv.py --device cuda --draws 8388608 --chunk 16384 --json tv_cuda.json

The figures, and what they say, are in docs/backbones.md (Precision).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from dataclasses import asdict, dataclass

import torch

from dllmbench.plugins.backbones.dream import DreamConfig, sample_tokens

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
TAIL_STD = 2.0
CANDIDATES = 8
HEAD = 64


@dataclass(frozen=True)
class Shape:
    gap: float  # logit gap between consecutive candidates
    top1: float  # target top-1 probability at T = 1


SHAPES = {
    "peaked": Shape(gap=3.0, top1=0.9),
    "medium": Shape(gap=0.7, top1=0.4),
    "flat": Shape(gap=0.3, top1=0.05),
}


def make_logits(shape: Shape, vocab: int, seed: int) -> torch.Tensor:
    """float64 logits [V] on the CPU: a N(0, TAIL_STD²) tail and CANDIDATES boosted tokens whose
    offset gives the shape's top-1 probability at T = 1 (as near as the tail allows)."""
    gen = torch.Generator().manual_seed(seed)
    tail = torch.randn(vocab, generator=gen, dtype=torch.float64) * TAIL_STD
    ids = torch.randperm(vocab, generator=gen)[:CANDIDATES]
    steps = -shape.gap * torch.arange(len(ids), dtype=torch.float64)

    def with_offset(offset: float) -> torch.Tensor:
        logits = tail.clone()
        logits[ids] = offset + steps
        return logits

    low, high = -50.0, 100.0
    for _ in range(100):
        mid = (low + high) / 2
        if torch.softmax(with_offset(mid), -1).max() < shape.top1:
            low = mid
        else:
            high = mid
    return with_offset((low + high) / 2)


def generator(device: str, seed: int, *labels: object) -> torch.Generator:
    """A generator on `device` seeded by the run seed and the labels (not by call order)."""
    salt = zlib.crc32(repr(labels).encode())
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + salt)


def reference_counts(
    logits: torch.Tensor, temperature: float, n: int, gen: torch.Generator, chunk: int
) -> tuple[torch.Tensor, int]:
    """Counts [V] of n reference draws from the row `logits` [V] (in its dtype), and how many
    of them fell back to the argmax because `Categorical` raised (the reference's `except`).

    `Categorical(probs).sample()` is `multinomial(probs / probs.sum(-1), 1, True)`: the
    normalised row, repeated, goes to `multinomial` with our generator."""
    vocab = logits.shape[-1]
    probs = torch.softmax(logits[None] / temperature, dim=-1)
    counts = torch.zeros(vocab, dtype=torch.long, device=logits.device)
    try:
        normalised = torch.distributions.Categorical(probs=probs).probs
    except ValueError:
        counts[probs[0].argmax()] = n
        return counts, n
    rows = normalised.expand(min(chunk, n), vocab).contiguous()
    fallbacks, done = 0, 0
    while done < n:
        m = min(chunk, n - done)
        try:
            drawn = torch.multinomial(rows[:m], 1, True, generator=gen)[:, 0]
            counts += torch.bincount(drawn, minlength=vocab)
        except RuntimeError:
            counts[probs[0].argmax()] += m
            fallbacks += m
        done += m
    return counts, fallbacks


def exact_counts(p64: torch.Tensor, n: int, gen: torch.Generator, chunk: int) -> torch.Tensor:
    """Counts [V] of n draws from the float64 law `p64` [V]."""
    counts = torch.zeros(p64.shape[-1], dtype=torch.long, device=p64.device)
    done = 0
    while done < n:
        m = min(chunk, n - done)
        drawn = torch.multinomial(p64[None], m, True, generator=gen)[0]
        counts += torch.bincount(drawn, minlength=p64.shape[-1])
        done += m
    return counts


def dllmbench_counts(
    logits: torch.Tensor, temperature: float, n: int, gen: torch.Generator, chunk: int
) -> torch.Tensor:
    """Counts [V] of n draws by dllmbench's Dream sampler from the row `logits` [V]."""
    config = DreamConfig(model="random", temperature=temperature, top_p=1.0)
    counts = torch.zeros(logits.shape[-1], dtype=torch.long, device=logits.device)
    done = 0
    while done < n:
        m = min(chunk, n - done)
        u = torch.rand(1, m, dtype=torch.float64, device=logits.device, generator=gen)
        drawn, _ = sample_tokens(logits[None], u, config)
        counts += torch.bincount(drawn[0], minlength=logits.shape[-1])
        done += m
    return counts


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    """½ Σ |counts/N − p|, in float64 on the CPU."""
    freq = counts.double().cpu()
    return 0.5 * (freq / freq.sum() - p.double().cpu()).abs().sum().item()


def merge_tail(x: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """x [V] → [len(head) + 1]: the head's entries, then everything else summed."""
    x = x.double().cpu()
    kept = x[head]
    return torch.cat([kept, (x.sum() - kept.sum())[None]])


def expected_tv(p: torch.Tensor, n: int) -> float:
    """E ½ Σ |X_i/n − p_i| for X_i ~ Binomial(n, p_i): de Moivre's mean absolute deviation
    E|X − np| = 2 k C(n, k) p^k (1 − p)^(n−k+1), k = ⌊np⌋ + 1."""
    p = p.double().cpu()
    p = p[(p > 0) & (p < 1)]
    k = torch.floor(n * p) + 1
    p, k = p[k <= n], k[k <= n]
    log_mad = (
        math.log(2)
        + torch.log(k)
        + math.lgamma(n + 1)
        - torch.lgamma(k + 1)
        - torch.lgamma(n - k + 1)
        + k * torch.log(p)
        + (n - k + 1) * torch.log1p(-p)
    )
    return 0.5 * torch.exp(log_mad).sum().item() / n


def expected_tv_large_n(p: torch.Tensor, n: int) -> float:
    """The large-N form of `expected_tv`: ½ Σ sqrt(2 p (1 − p) / (π n))."""
    p = p.double().cpu()
    return 0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum().item()


def measure(
    name: str, dtype_name: str, temperature: float, args: argparse.Namespace
) -> dict[str, object]:
    device, n, chunk = args.device, args.draws, args.chunk
    logits = make_logits(SHAPES[name], args.vocab, args.seed).to(DTYPES[dtype_name])
    logits = logits.to(device)
    p64 = torch.softmax(logits.double() / temperature, -1)
    head = torch.topk(p64.cpu(), min(HEAD, args.vocab)).indices
    p_head = merge_tail(p64, head)
    rounded = torch.softmax(logits[None] / temperature, -1)[0].double()
    result: dict[str, object] = {
        "shape": name,
        "dtype": dtype_name,
        "temperature": temperature,
        "draws": n,
        "top1": p64.max().item(),
        "entropy_nats": -(p64 * torch.log(p64.clamp_min(1e-300))).sum().item(),
        "mass_outside_head": 1 - p_head[:-1].sum().item(),
        "rounding_tv": tv(rounded / rounded.sum(), p64),
        "expected_floor": expected_tv(p64, n),
        "expected_floor_large_n": expected_tv_large_n(p64, n),
        "expected_floor_head": expected_tv(p_head, n),
    }
    samplers: dict[str, dict[str, float]] = {}
    for sampler in ("reference", "dllmbench", "exact"):
        gen = generator(device, args.seed, name, dtype_name, temperature, sampler)
        start = time.perf_counter()
        if sampler == "reference":
            counts, fallbacks = reference_counts(logits, temperature, n, gen, chunk)
            result["argmax_fallbacks"] = fallbacks
        elif sampler == "dllmbench":
            counts = dllmbench_counts(logits, temperature, n, gen, args.exact_chunk)
        else:
            counts = exact_counts(p64, n, gen, args.exact_chunk)
        counts = counts.cpu()
        samplers[sampler] = {
            "tv": tv(counts, p64),
            "tv_head": tv(merge_tail(counts, head), p_head),
            "seconds": time.perf_counter() - start,
        }
    result["samplers"] = samplers
    return result


HEADER = (
    f"{'dtype':5} {'shape':6} {'T':>4} {'top1':>5} {'H':>5}  {'sampler':9} "
    f"{'TV':>7} {'E floor':>7}  {'TV head':>7} {'E head':>7}  {'round':>7} {'s':>6}"
)


def rows(r: dict) -> list[str]:
    """The table's lines for one case: one per sampler."""
    lines = []
    for sampler, s in r["samplers"].items():
        lines.append(
            f"{r['dtype']:5} {r['shape']:6} {r['temperature']:4.1f} {r['top1']:5.3f} "
            f"{r['entropy_nats']:5.2f}  {sampler:9} {s['tv']:7.4f} "
            f"{r['expected_floor']:7.4f}  {s['tv_head']:7.4f} "
            f"{r['expected_floor_head']:7.4f}  {r['rounding_tv']:7.4f} {s['seconds']:6.1f}"
        )
    if r["argmax_fallbacks"]:
        lines.append(f"  ({r['argmax_fallbacks']} reference draws fell back to the argmax)")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--draws", type=int, default=8192, help="draws per sampler and case")
    parser.add_argument("--vocab", type=int, default=152064, help="V (Dream's: 152,064)")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--temperature", nargs="+", type=float, default=[0.5, 1.0])
    parser.add_argument("--shape", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=4096, help="rows per reference call")
    parser.add_argument("--exact-chunk", type=int, default=1 << 20, help="draws per float64 call")
    parser.add_argument("--json", metavar="OUT", help="write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    print(f"V = {args.vocab}, N = {args.draws} draws per sampler, device {args.device}")
    print(HEADER)
    print("-" * len(HEADER))
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "vocab": args.vocab,
        "draws": args.draws,
        "seed": args.seed,
        "shapes": {k: asdict(v) for k, v in SHAPES.items()},
        "tail_std": TAIL_STD,
        "candidates": CANDIDATES,
        "head": HEAD,
        "argv": sys.argv[1:] if argv is None else argv,
        "results": [],
    }
    for dtype_name in args.dtype:
        for name in args.shape:
            for temperature in args.temperature:
                result = measure(name, dtype_name, temperature, args)
                report["results"].append(result)
                print("\n".join(rows(result)), flush=True)
                if args.json:  # after every case, so a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
