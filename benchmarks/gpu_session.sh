#!/usr/bin/env bash
# One device call of a session, on a machine with 2 GPUs (nvidia-h100-x2 / nvidia-h200-x2):
#   bash benchmarks/gpu_session.sh parallel   the ON probe (GPU 0), then `bench all --only parallel`
#   bash benchmarks/gpu_session.sh single     `bench all --only train,steps` on GPU 0
# Logs and results under $OUT (copy them into benchmarks/results/).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
mkdir -p "$OUT/all"
case "${1:?parallel or single}" in
parallel)
    CUDA_VISIBLE_DEVICES=0 timeout 75 python3 benchmarks/on_probe.py 2>&1 | grep -v Warning > "$OUT/on-probe-$tag.txt"
    tail -4 "$OUT/on-probe-$tag.txt"
    timeout 500 python3 -m spikefuse.cli bench all --only parallel --out "$OUT/all" 2>&1 | grep -v Warning \
        | tee "$OUT/all-parallel-log.txt" | grep -E "GPU|^\||speedup|failed|ok after" | tail -60 ;;
single)
    CUDA_VISIBLE_DEVICES=0 timeout 570 python3 -m spikefuse.cli bench all --only "${PARTS:-train,steps}" --out "$OUT/all" \
        2>&1 | grep -v Warning | tee "$OUT/all-single-log.txt" | tail -40 ;;
esac
