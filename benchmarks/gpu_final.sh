#!/usr/bin/env bash
# Last GPU pass of the session: issue 16's accuracy runs, the recurrent benchmark and the
# recurrent-LIF neuron comparison again with the tuned tiles, a kernel-time profile of the
# sparse step, and the GPU-only kernel tests. Logs under $OUT, most important first.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
timeout ${ACC_S:-230} python3 benchmarks/sparse_accuracy.py "$OUT/sparse-accuracy-$tag.json" 2>&1 | grep -v "sample/s\|Warning" | tee "$OUT/sparse-accuracy-$tag.txt"
mkdir -p "$OUT/recurrent" "$OUT/neurons"
timeout ${REC_S:-110} python3 -m spikefuse.cli bench sparse --out "$OUT/recurrent" --modes dense,sparse,auto --no-kernel \
    --cases ipu-shd-recurrent:4:1:0.9,ipu-shd-recurrent:4:8:0.9,ipu-shd-recurrent:1:8:0.9,ipu-shd-recurrent:1:1:0.9 \
    2>&1 | grep -v Warning | tee "$OUT/recurrent/bench-recurrent-$tag.txt"
timeout ${NEU_S:-70} python3 -m spikefuse.cli bench neurons --neurons rlif --out "$OUT/neurons" 2>&1 | grep -v Warning | tee "$OUT/neurons/bench-neurons-rlif-$tag.txt"
timeout 50 python3 benchmarks/profile_sparse_step.py 2>&1 | grep -v Warning | tee "$OUT/profile-sparse-step-$tag.txt"
SPIKEFUSE_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q tests/test_kernels_gpu.py 2>&1 | tail -6 | tee "$OUT/gpu-tests-kernels-gpu-only-$tag.txt"
