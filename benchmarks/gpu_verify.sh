#!/usr/bin/env bash
# One GPU call: the kernel tests on compiled kernels (logs gpu-tests-*.txt), then the dense
# wide-step profile that sizes the sparse work. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/gpu-tests-kernels-$tag.txt"
SPIKEFUSE_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -x tests/test_lif.py tests/test_bn_lif.py \
    tests/test_kernels_gpu.py tests/test_capture_gpu.py tests/test_launch.py tests/test_double_backward.py \
    tests/test_fuzz.py 2>&1 | tail -25 | tee -a "$OUT/gpu-tests-kernels-$tag.txt"
timeout 120 python3 benchmarks/profile_dense_wide.py "$OUT/profile-dense-wide-$tag.json" 2>&1 | tee "$OUT/profile-dense-wide-$tag.txt"
SPIKEFUSE_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q tests/test_compile_gpu.py 2>&1 | tail -8 | tee "$OUT/gpu-tests-compile-$tag.txt"
