#!/usr/bin/env bash
# Issue 16, second GPU pass: the acceptance region at natural activity (lr 0), the
# persistent weight-gradient kernel, and the accuracy runs with their variants.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
mkdir -p "$OUT/natural"
timeout 110 python3 -m spikefuse.cli bench sparse --out "$OUT/natural" --modes dense,sparse-adam,sparse,auto \
    --cases ipu-shd:4:1:0.9,ipu-shd:16:1:0.9,ipu-shd:4:8:0.9,ipu-shd:16:8:0.9,ipu-shd:1:8:0.9,ipu-shd:4:48:0.9 2>&1 | grep -v Warning | tee "$OUT/natural/bench-sparse-$tag.txt"
timeout 60 python3 benchmarks/sparse_accuracy.py "$OUT/sparse-accuracy-$tag.json" 6 1.0 randman 2>&1 | grep -v "sample/s" | tee "$OUT/sparse-accuracy-$tag.txt"
