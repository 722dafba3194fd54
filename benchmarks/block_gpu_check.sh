#!/usr/bin/env bash
# The block-diffusion model's cached step beside Dream's full-canvas step, on one GPU in bf16:
# random weights at Qwen3-8B's shape (SDAR-8B, TraDo-8B) and Dream-7B's, 64 rows of a 128-token
# prompt and 512 generated tokens, block lengths 4 and 32; then `block`, `llada2` (LLaDA2.0-
# mini's mixture of experts), `sdar-moe` (SDAR-30B-A3B's, its experts one at a time as its own
# code runs them: 61 GB of weights) and `fast-dllm-v2` end to end through the engine (Majority@8
# on 8 GSM8K problems, 256 tokens; some 4 to 8 minutes in all on an H100 or H200, unmeasured).
#
#   benchmarks/block_gpu_check.sh [more bench_gpu.py options, e.g. --rows 32]
#
# `dllmbench` must be importable (installed, or PYTHONPATH); nothing on this path imports
# `datasets` or `math_verify`. Prints the table; the JSON report goes to $OUT/block_gpu.json
# when OUT is set, else to block_gpu.json in the temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
json="${OUT:-${TMPDIR:-/tmp}}/block_gpu.json"
python -c 'import torch, transformers; print("torch", torch.__version__, "· transformers",
    transformers.__version__, "·", torch.cuda.get_device_name() if torch.cuda.is_available()
    else "no GPU")'
python benchmarks/bench_gpu.py --models block,block-engines --json-file "$json" "$@"
echo "JSON report: $json"
