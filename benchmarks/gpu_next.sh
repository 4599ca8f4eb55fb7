#!/usr/bin/env bash
# GPU runs for the next sessions, each under 10 minutes. Every part of issue 19's one-command run
# has run through `bench all` (benchmarks/results/all-nvidia-h100-80gb-hbm3/, on-nvidia-h200.*).
# Left after 2026-11-25 (third session): `all on` under the current code, whose rounds give each
# call 0.2 s of its own warm-up (only its N = 16384 cases ran so, on-16384-settled/); then refresh
# the table in docs/benchmarks.md and the README's paragraph from it. Modes:
#   bash benchmarks/gpu_next.sh tests   compiled-kernel tests (pytest -n, xdist carried in .whl/):
#                                       the neurons, the traces, capture and inductor on them
#   bash benchmarks/gpu_next.sh kernel  the sparse weight-gradient kernel against cuBLAS, captured
#   bash benchmarks/gpu_next.sh region  the acceptance region (x4, B 1 and 8, natural activity) on the
#                                       N-MNIST and DVS-Gesture networks
#   bash benchmarks/gpu_next.sh map-ff  the sparse map's feed-forward half (natural, 1 %, 5 %)
#   bash benchmarks/gpu_next.sh map-rec its recurrent half
#   bash benchmarks/gpu_next.sh acc     issue 16's accuracy over three seeds (cut 0.9 per batch, per
#                                       sequence and per step)
#   bash benchmarks/gpu_next.sh all P   `spikefuse bench all --only P` (P: lif, train, steps, sparse,
#                                       data, neurons, on, parallel): issue 19's one-command run, a
#                                       part per call; parallel on nvidia-h100-x2 / nvidia-h200-x2
# Logs and results under $OUT; copy them into benchmarks/results/.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
case "${1:-tests}" in
tests)
    # Triton compiles on the host: xdist spreads it over the cores (put it in .whl/ first:
    # pip download --no-deps -d .whl pytest-xdist execnet); without it, one process.
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${WORKERS:-12}")
    files="${FILES:-tests/test_potential_threshold.py tests/test_alif.py tests/test_cuba.py tests/test_surrogate_callable.py
           tests/test_recurrent_alif.py tests/test_recurrent_lif.py tests/test_kernels_gpu.py tests/test_traces.py
           tests/test_lif.py tests/test_bn_lif.py tests/test_compile_gpu.py tests/test_capture_gpu.py}"
    SPIKEFUSE_TEST_DEVICE=cuda timeout ${TEST_S:-540} python3 -m pytest -q --tb=short -p no:cacheprovider \
        $workers $files 2>&1 | grep -v "Warning:" | tail -60 | tee -a "$OUT/gpu-tests-next-$tag.txt" ;;
kernel)
    mkdir -p "$OUT/kernel"
    python3 -m pytest -q -p no:cacheprovider tests/test_bench_sparse.py -k captured 2>&1 | tail -1
    timeout 300 python3 -m spikefuse.cli bench sparse --out "$OUT/kernel" --cases ipu-shd:1:1:0.9 --modes dense \
        --activity natural 2>&1 | grep -v Warning | grep "weight grad\|wrote" ;;
region)
    mkdir -p "$OUT/region"
    timeout 560 python3 -m spikefuse.cli bench sparse --out "$OUT/region" --modes dense,sparse,auto --no-kernel \
        --cases ipu-nmnist:4:1:0.9,ipu-nmnist:4:8:0.9,ipu-dvsgesture:4:1:0.9,ipu-dvsgesture:4:8:0.9 \
        --activity natural 2>&1 | grep -v Warning | grep -v "^  " | tail -30 ;;
map-ff|map-rec)
    # the map's two halves, one call each; SpikingJelly's dense network runs where the bench
    # allows it (x1/x4, B <= 8, natural activity)
    half=$([ "$1" = map-ff ] && echo map-feedforward || echo map-recurrent)
    mkdir -p "$OUT/$1"
    timeout 560 python3 -m spikefuse.cli bench sparse --out "$OUT/$1" --cases $half --modes dense,sparse,auto,spikingjelly \
        --no-kernel --activity natural,0.01,0.05 --chart 2>&1 | grep -v Warning | grep -v "^  " | tail -60 ;;
acc)
    timeout 500 python3 benchmarks/sparse_accuracy.py "$OUT/sparse-accuracy-scopes-$tag.json" --seed 0,1,2 --sigma-u 1 \
        --variants sparse-step,sparse-sequence 2>&1 | grep -v Warning | tee "$OUT/sparse-accuracy-scopes-$tag.txt" \
        | grep VERDICT ;;
all)
    mkdir -p "$OUT/all"
    timeout 580 python3 -m spikefuse.cli bench all --only "${2:?which part}" --out "$OUT/all" 2>&1 | grep -v Warning | tail -30 ;;
*)
    echo "usage: bash benchmarks/gpu_next.sh tests|kernel|region|map-ff|map-rec|acc|all PART" >&2; exit 2 ;;
esac
