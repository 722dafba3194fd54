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
    python benchmarks/bench_demo.py --order after   # one order: its column alone
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
    orders = [name for name in args.order.split(",") if name]
    unknown = sorted(set(orders) - {"before", "after"})
    if unknown or not orders or len(set(orders)) != len(orders):
        parser.error(f"--order takes before and/or after, each once, not {args.order!r}")
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in orders:
            measured[name] = measure(cfg, name == "after", Path(tmp) / name)
    print(
        f"demo, {args.limit} problems, budgets {', '.join(map(str, cfg.budgets()))}, "
        f"backbone options {cfg.backbone_config or 'default'}"
    )
    print(table(measured))


def table(measured: dict[str, dict[str, Any]]) -> str:
    """One column per order run, in the order run; with both, their ratio and whether they
    decide alike."""
    names = list(measured)
    both = {"before", "after"} <= set(names)
    first = measured[names[0]]
    lines = [f"{'':20} " + " ".join(f"{n:>10}" for n in names) + (" after/before" if both else "")]
    for key in (k for k in first if not k.startswith("_")):
        values = [measured[n][key] for n in names]
        line = f"{key:20} " + " ".join(f"{v!s:>10}" for v in values)
        if both:
            b, a = measured["before"][key], measured["after"][key]
            line += f" {a / b:>12.3f}" if isinstance(a, int | float) and b else ""
        lines.append(line.rstrip())
    if both:
        same = measured["before"]["_decisions"] == measured["after"]["_decisions"]
        lines.append(f"same decisions: {same}")
        same = measured["before"]["_accuracy"] == measured["after"]["_accuracy"]
        lines.append(f"same accuracies: {same}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
