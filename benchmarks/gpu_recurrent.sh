#!/usr/bin/env bash
# Issue 16, recurrent part (and the feed-forward acceptance region at natural activity):
# the sparse recurrent path's tests on compiled kernels, then `spikefuse bench sparse` on
# the recurrent and feed-forward IPU-SHD networks at lr 0. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
SPIKEFUSE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_recurrent_lif.py \
    -k "sparse or column or activity or dispatch or double or compile" 2>&1 | tail -6 | tee "$OUT/gpu-tests-recurrent-$tag.txt"
mkdir -p "$OUT/recurrent" "$OUT/natural"
timeout ${REC_S:-200} python3 -m spikefuse.cli bench sparse --out "$OUT/recurrent" --modes dense,sparse,auto --no-kernel \
    --cases ${REC_CASES:-ipu-shd-recurrent:4:1:0.9,ipu-shd-recurrent:4:8:0.9,ipu-shd-recurrent:1:8:0.9,ipu-shd-recurrent:4:48:0.9,ipu-shd-recurrent:1:1:0.9} \
    2>&1 | grep -v Warning | tee "$OUT/recurrent/bench-recurrent-$tag.txt"
timeout ${FF_S:-150} python3 -m spikefuse.cli bench sparse --out "$OUT/natural" --modes dense,sparse-adam,sparse,auto \
    --cases ipu-shd:4:1:0.9,ipu-shd:16:1:0.9,ipu-shd:4:8:0.9,ipu-shd:16:8:0.9,ipu-shd:1:8:0.9,ipu-shd:4:48:0.9 2>&1 | grep -v Warning | tee "$OUT/natural/bench-sparse-$tag.txt"
