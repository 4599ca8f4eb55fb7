#!/usr/bin/env bash
# What the 2026-11-25 session built but could not run on a GPU (its device time ran out),
# in calls of under 10 minutes each:
#   bash benchmarks/gpu_next.sh tests   compiled-kernel tests of the changed kernels (the fused
#                                       threshold gradient, ALIF/CUBA potential traces and initial
#                                       state, the Triton-written surrogate, recurrent ALIF, the
#                                       RLIF helper refactor) and inductor/capture on them
#   bash benchmarks/gpu_next.sh speed   the LIF kernels' speed after those changes (against
#                                       lif-nvidia-h200.md), bench neurons (recurrent ALIF), bench
#                                       on with the per-GEMM floor, bench sparse at x4 B=8 and in
#                                       fixed activity
#   bash benchmarks/gpu_next.sh map     the sparse map (--cases map) at natural and fixed activity
# Logs and results under $OUT; copy them into benchmarks/results/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
case "${1:-tests}" in
tests)
    # Triton compiles on the host: xdist (carried in .whl/) spreads it over the cores.
    files="tests/test_potential_threshold.py tests/test_alif.py tests/test_cuba.py tests/test_surrogate_callable.py
           tests/test_recurrent_alif.py tests/test_recurrent_lif.py tests/test_kernels_gpu.py
           tests/test_lif.py tests/test_bn_lif.py tests/test_compile_gpu.py tests/test_capture_gpu.py"
    SPIKEFUSE_TEST_DEVICE=cuda timeout ${TEST_S:-540} python3 -m pytest -q --tb=short -p no:cacheprovider \
        -n ${WORKERS:-12} $files 2>&1 | grep -v "Warning:" | tail -60 | tee -a "$OUT/gpu-tests-next-$tag.txt" ;;
speed)
    mkdir -p "$OUT/lif" "$OUT/neurons" "$OUT/on" "$OUT/sparse"
    timeout 120 python3 -m spikefuse.cli bench lif --out "$OUT/lif" --no-sweep 2>&1 | grep -v Warning | tail -15
    timeout 90 python3 -m spikefuse.cli bench neurons --out "$OUT/neurons" 2>&1 | grep -v Warning | tail -12
    timeout 200 python3 -m spikefuse.cli bench on --out "$OUT/on" 2>&1 | grep -v Warning | tail -8
    timeout 120 python3 -m spikefuse.cli bench sparse --out "$OUT/sparse" --modes dense,sparse,auto --no-kernel --chart \
        --cases ipu-shd:4:1:0.9,ipu-shd:4:8:0.9 --activity natural,0.01,0.05 2>&1 | grep -v Warning | tail -14 ;;
map)
    mkdir -p "$OUT/map"
    timeout 560 python3 -m spikefuse.cli bench sparse --out "$OUT/map" --cases map --modes dense,sparse --no-kernel \
        --activity natural,0.01,0.05 --chart 2>&1 | grep -v Warning | tail -60 ;;
*)
    echo "usage: bash benchmarks/gpu_next.sh tests|speed|map" >&2; exit 2 ;;
esac
