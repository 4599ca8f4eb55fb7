#!/usr/bin/env bash
# One short GPU pass for a session with little device time: the sparse step with LazyAdam
# reading the backward's row note (issue 16's x4 acceptance cases), the new and refactored
# kernels' tests on compiled kernels (recurrent ALIF, the RLIF helpers, ALIF/CUBA potential
# traces, the fused threshold gradient), and the corrected Open Neuromorphic benchmark.
# Logs under $OUT, most important first; each part under its own time limit.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
mkdir -p "$OUT/sparse" "$OUT/on"
timeout ${SPARSE_S:-80} python3 -m spikefuse.cli bench sparse --out "$OUT/sparse" --modes dense,sparse,auto --no-kernel \
    --cases ipu-shd:4:1:0.9,ipu-shd:4:8:0.9 2>&1 | grep -v Warning | tee "$OUT/sparse/bench-sparse-notes-$tag.txt"
SPIKEFUSE_TEST_DEVICE=cuda timeout ${TEST_S:-120} python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_recurrent_alif.py tests/test_potential_threshold.py tests/test_alif.py tests/test_cuba.py \
    tests/test_kernels_gpu.py tests/test_recurrent_lif.py 2>&1 | tail -8 | tee "$OUT/gpu-tests-new-kernels-$tag.txt"
timeout ${ON_S:-200} python3 -m spikefuse.cli bench on --out "$OUT/on" ${ON_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/on/bench-on-$tag.txt"
