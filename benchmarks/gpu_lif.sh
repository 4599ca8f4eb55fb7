#!/usr/bin/env bash
# One device call for the LIF core: launch-config sweep, GPU correctness tests, benchmark.
# Run on the GPU machine from the repo root with peers' wheels in .whl (see README).
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
[ "${OVERHEAD:-1}" = 1 ] && python3 benchmarks/overhead_lif.py "$OUT/overhead-lif.jsonl" 2>&1 | tail -8
# the sweep writes the chosen launch configuration into the package before the tests
# (which cover every chosen configuration's chunk edges) and the benchmark
[ "${TUNE:-1}" = 1 ] && timeout 300 python3 benchmarks/tune_lif.py "$OUT/tune-lif.json" src/spikefuse/ops/lif_tuning.json 2>&1 | tee "$OUT/tune-lif.txt" && cp src/spikefuse/ops/lif_tuning.json "$OUT/"
SPIKEFUSE_TEST_DEVICE=cuda timeout "${TEST_S:-400}" python3 -m pytest -q -x tests/test_lif.py tests/test_launch.py tests/test_bn_lif.py -k "${TESTS:-}" 2>&1 | tail -5 | tee "$OUT/gpu-tests.txt"
[ "${BENCH:-1}" = 1 ] && timeout 420 python3 -m spikefuse.bench.lif --out "$OUT" 2>&1 | tee "$OUT/bench-lif.txt"
