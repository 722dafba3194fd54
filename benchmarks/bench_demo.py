"""The shipped demo, budget after budget (after) against every budget at once (before).

Runs the demo (`dllmbench run` with no --task/--backbone: the tiny model on `arith`, every
method family at 208 and 832 passes per problem) twice in this process, into two fresh run
directories, through `runner.run`:

- before: `RunConfig(by_budget=False)`, the methods of both budgets served together;
- after: the default, budget by budget, smallest first, the larger budget reusing the rows the
  smaller computed; its table can be shown when the first budget is done.

For each it prints the seconds to the first budget's results (before: only at the end), the
seconds to the end, denoising rows and forwards, rows per second of the denoising forward
(its own seconds), the padding (tokens computed over real tokens, as compute.json reports)
and the scoring rows; then whether the records make the same decisions (selection, answer,
correctness, passes per method). Both orders run on the same machine within one run of this
script; the first run also pays for loading (run `--order after,before` to see that cost
move).

    python benchmarks/bench_demo.py [--limit 20] [--order before,after]
    python benchmarks/bench_demo.py --backbone-options device=cuda,dtype=bfloat16   # a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dllmbench.cli import build_parser
from dllmbench.cli.run import run_config
from dllmbench.running.runner import run


def measure(cfg: Any, by_budget: bool, out: Path) -> dict[str, Any]:
    cfg = dataclasses.replace(cfg, by_budget=by_budget, out=str(out))
    start = time.perf_counter()
    first: list[float] = []
    outcome = run(cfg, on_budget=lambda _results, _budget: first.append(time.perf_counter()))
    end = time.perf_counter() - start
    compute = json.loads((out / "compute.json").read_text())["total"]
    physical = compute["physical"]
    denoise = physical["denoise"]
    scoring = sum(v["rows"] for k, v in physical.items() if k.startswith("score"))
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {
        "first table s": round(first[0] - start if first else end, 1),
        "end s": round(end, 1),
        "denoise rows": denoise["rows"],
        "denoise forwards": denoise["forwards"],
        "rows/s (forward)": round(denoise["rows"] / denoise["seconds"], 1),
        "padding": denoise.get("padding"),
        "scoring rows": scoring,
        "records": len(records),
        "_decisions": sorted(
            (
                r["problem"],
                r["method"],
                r["selected"],
                r["answer"],
                r["correct"],
                json.dumps(r["ledger"]["passes"], sort_keys=True),
            )
            for r in records
        ),
        "_accuracy": {
            (m["id"], m["budget"]): m["accuracy"]["value"] if m["accuracy"] else None
            for m in outcome.results["methods"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20, help="first N problems (demo: 100)")
    parser.add_argument("--order", default="before,after", help="which runs first")
    parser.add_argument("--backbone-options", default="", help="e.g. device=cuda,dtype=bfloat16")
    args = parser.parse_args()
    cfg = run_config(build_parser().parse_args(["run", "--limit", str(args.limit)]))
    options = dict(kv.split("=", 1) for kv in args.backbone_options.split(",") if kv)
    cfg = dataclasses.replace(cfg, backbone_config={**cfg.backbone_config, **options})
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.order.split(","):
            measured[name] = measure(cfg, name == "after", Path(tmp) / name)
    before, after = measured["before"], measured["after"]
    print(
        f"demo, {args.limit} problems, budgets {', '.join(map(str, cfg.budgets()))}, "
        f"backbone options {cfg.backbone_config or 'default'}"
    )
    keys = [k for k in before if not k.startswith("_")]
    print(f"{'':20} {'before':>10} {'after':>10} {'after/before':>13}")
    for key in keys:
        b, a = before[key], after[key]
        ratio = f"{a / b:.3f}" if isinstance(a, int | float) and b else ""
        print(f"{key:20} {b!s:>10} {a!s:>10} {ratio:>13}")
    print("same decisions:", before["_decisions"] == after["_decisions"])
    print("same accuracies:", before["_accuracy"] == after["_accuracy"])


if __name__ == "__main__":
    main()
