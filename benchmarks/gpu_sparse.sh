#!/usr/bin/env bash
# Issue 16 on one GPU: spikefuse bench sparse (steps, weight-gradient kernel, cross-checks),
# then the dense-vs-sparse accuracy runs. Logs and results under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
timeout ${BENCH_S:-330} python3 -m spikefuse.cli bench sparse --out "$OUT" ${CASES:+--cases $CASES} 2>&1 | grep -v Warning | tee "$OUT/bench-sparse-$tag.txt"
timeout ${ACC_S:-220} python3 benchmarks/sparse_accuracy.py "$OUT/sparse-accuracy-$tag.json" ${EPOCHS:-8} 2>&1 | tee "$OUT/sparse-accuracy-$tag.txt"
