#!/usr/bin/env bash
# Early GPU check of the recurrent LIF: its interpreter tests on compiled kernels, a timing.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
SPIKEFUSE_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -x tests/test_recurrent_lif.py 2>&1 | tail -15 | tee "$OUT/gpu-tests-rlif.txt"
timeout 120 python3 benchmarks/rlif_smoke.py 2>&1 | grep -v Warn | tee "$OUT/rlif-smoke.txt"
