#!/usr/bin/env bash
# Issue 15/16 GPU pass: the new neurons against their peers (spikefuse bench neurons), then
# the recurrent sparse benchmark again. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
SPIKEFUSE_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q tests/test_recurrent_lif.py \
    -k "sparse or column" 2>&1 | tail -3 | tee "$OUT/gpu-tests-recurrent-sparse-$tag.txt"
mkdir -p "$OUT/recurrent" "$OUT/neurons"
timeout ${REC_S:-150} python3 -m spikefuse.cli bench sparse --out "$OUT/recurrent" --modes dense,sparse,auto --no-kernel \
    --cases ${REC_CASES:-ipu-shd-recurrent:4:1:0.9,ipu-shd-recurrent:4:8:0.9,ipu-shd-recurrent:1:8:0.9,ipu-shd-recurrent:1:1:0.9} \
    2>&1 | grep -v Warning | tee "$OUT/recurrent/bench-recurrent-$tag.txt"
timeout ${NEU_S:-240} python3 -m spikefuse.cli bench neurons --out "$OUT/neurons" 2>&1 | grep -v Warning | tee "$OUT/neurons/bench-neurons-$tag.txt"
