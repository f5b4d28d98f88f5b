#!/usr/bin/env bash
# The GPU check, in one go on a machine with CUDA (its own torch; no gradio or plotly needed).
# Usage: bash bench/gpu_check.sh [OUT_DIR]   (default $OUT, else ./gpu_check_out)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 bench/gpu_check.py --out "$out" 2>&1 | grep -v -E '^(USDT|\[W)' | tee "$out/gpu_check.txt"
# The CLI exactly as the README gives it, and the compare table.
python3 -m profiling run --variant naive --device cuda --batch 8 --heads 16 --seq-len 1024 --head-dim 64 \
    --dtype bfloat16 --trace-dir "$out/cli" --json > "$out/cli_naive.json"
python3 bench/compare.py 2>&1 | grep -v -E '^(USDT|\[W)' | tee "$out/compare.txt"
rm -rf "$out/cli"
