#!/usr/bin/env bash
# The GPU check, in one go on a machine with CUDA (its own torch; no gradio or plotly needed).
# Usage: bash bench/gpu_check.sh [OUT_DIR]   (default $OUT, else ./gpu_check_out)
# Writes at most 7 files: up to 6 gzipped traces and gpu_check.txt (report, CLI summary, compare table).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$out"
report="$out/gpu_check.txt"
export PYTHONPATH=. PYTHONUNBUFFERED=1
quiet() { grep -v -E '^(USDT|\[W)' || true; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$report" || true
python3 bench/gpu_check.py --out "$out" 2>&1 | quiet | tee -a "$report"
# The CLI exactly as the README gives it, then the compare table.
cli_dir=$(mktemp -d)
{
    echo; echo "== python -m profiling run --variant naive --device cuda (blog shape) --json"
    python3 -m profiling run --variant naive --device cuda --batch 8 --heads 16 --seq-len 1024 --head-dim 64 \
        --dtype bfloat16 --trace-dir "$cli_dir" --json 2>&1 | quiet
    echo; echo "== bench/compare.py"
    python3 bench/compare.py 2>&1 | quiet
} | tee -a "$report"
rm -rf "$cli_dir"
