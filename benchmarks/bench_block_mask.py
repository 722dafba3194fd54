"""CPU benchmark: building a packed forward's FlexAttention document mask, two ways.

- `create_block_mask`: torch's `create_block_mask(doc[q] == doc[kv])` uncompiled, which
  evaluates the mask at every token pair (what `packed_hidden` did before);
- `document_block_mask`: the BlockMask built from the blocks' row ranges (packing.py), a few
  [blocks, blocks] int32 tensors.

Rows of `--row-length` tokens laid end to end up to each `--tokens` length. Each (way, length)
runs in a fresh process: `peak_added_mb` is how much its peak resident memory (VmHWM, Linux)
grows during the first build, `seconds` the median of `--repeats` builds after it. Ratios are
taken within one run (the same machine, the same load).

    python benchmarks/bench_block_mask.py [--tokens 8192,16384] [--json]
    python benchmarks/bench_block_mask.py --ways document_block_mask --tokens 262144,524288

The second measures only the new way, at lengths where its [blocks, blocks] tensors dominate
(`bytes_per_block_pair`: the peak growth over blocks², which `packing.block_mask_bytes` counts
as 96); `create_block_mask` there would need tens of GB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

WAYS = ("create_block_mask", "document_block_mask")


@dataclass(frozen=True)
class Measure:
    way: str
    tokens: int
    rows: int
    seconds: float  # median build time
    peak_added_mb: float  # growth of the process's peak resident memory during one build

    @property
    def bytes_per_block_pair(self) -> float:
        return self.peak_added_mb * 2**20 / (self.tokens / 128) ** 2


def peak_rss() -> int:
    """The process's peak resident memory in bytes (VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(way: str, tokens: int, row_length: int, repeats: int) -> Measure:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from dllmbench.plugins.backbones.packing import document_block_mask

    whole, rest = divmod(tokens, row_length)
    lengths = [row_length] * whole + ([rest] if rest else [])
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def build():
        if way == "document_block_mask":
            return document_block_mask(doc)
        return create_block_mask(
            lambda b, h, q, kv: doc[q] == doc[kv], None, None, tokens, tokens, device="cpu"
        )

    before = peak_rss()
    build()
    added = peak_rss() - before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build()
        times.append(time.perf_counter() - start)
    return Measure(way, tokens, len(lengths), statistics.median(times), added / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,16384", help="comma-separated, whole blocks")
    parser.add_argument("--row-length", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated: " + ", ".join(WAYS)
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        way, tokens = args.child
        print(json.dumps(asdict(child(way, int(tokens), args.row_length, args.repeats))))
        return
    ways = [w.strip() for w in args.ways.split(",")]
    if not ways or any(w not in WAYS for w in ways):
        parser.error(f"--ways: {args.ways!r}; choose from {', '.join(WAYS)}")
    results = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        if tokens % 128:
            parser.error(f"--tokens: {tokens} is not a whole number of 128-token blocks")
        pair = {}
        for way in ways:
            out = subprocess.run(
                [sys.executable, __file__, "--child", way, str(tokens),
                 "--row-length", str(args.row_length), "--repeats", str(args.repeats)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            pair[way] = Measure(**json.loads(out.stdout))
        result: dict = {"tokens": tokens, "rows": next(iter(pair.values())).rows}
        for way, m in pair.items():
            result[way] = {**asdict(m), "bytes_per_block_pair": round(m.bytes_per_block_pair, 1)}
        if len(pair) == len(WAYS):
            old, new = pair["create_block_mask"], pair["document_block_mask"]
            result["time_ratio"] = round(old.seconds / new.seconds, 1)
            result["memory_ratio"] = round(old.peak_added_mb / max(new.peak_added_mb, 1e-3), 1)
        results.append(result)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        parts = [
            f"{way} {r[way]['seconds']:.3g} s, +{r[way]['peak_added_mb']:.1f} MB "
            f"({r[way]['bytes_per_block_pair']} B per block pair)"
            for way in ways
        ]
        if "time_ratio" in r:
            parts.append(f"{r['time_ratio']}× faster, {r['memory_ratio']}× less memory")
        print(f"{r['tokens']:>6} tokens ({r['rows']} rows): " + "; ".join(parts))


if __name__ == "__main__":
    main()
