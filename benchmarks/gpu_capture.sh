#!/usr/bin/env bash
# The capture/compile issue on one GPU: GPU tests, then the step benchmark and the trainer's
# throughput, logs and results under $OUT (the device tool's output folder).
#   bash benchmarks/gpu_capture.sh tests    # GPU tests (logs: gpu-tests-*.txt)
#   bash benchmarks/gpu_capture.sh bench    # spikefuse bench steps + spikefuse train throughput
#   bash benchmarks/gpu_capture.sh quick    # a few bench cases (a first look)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"

case "${1:-all}" in
tests)  # compiled kernels on the GPU (tests/conftest.py), not the interpreter
    SPIKEFUSE_TEST_DEVICE=cuda python3 -m pytest -q -s tests/test_compile_gpu.py tests/test_capture_gpu.py tests/test_launch.py 2>&1 | tee "$OUT/gpu-tests-capture-$tag.txt"
    ;;
quick)
    python3 -m spikefuse.cli bench steps --out "$OUT" --nets ipu-shd --batches 1,8 --compile-batches 1 2>&1 \
        | tee "$OUT/bench-steps-quick-$tag.txt"
    ;;
bench)  # in two parts, each well under the device's 10 minutes a command
    part=${3:-part1}; mkdir -p "$OUT/$part"
    python3 -m spikefuse.cli bench steps --out "$OUT/$part" --nets "${2:-ipu-shd,shd}" ${4:-} 2>&1 \
        | tee "$OUT/$part/bench-steps-$tag.txt"
    ;;
diagnose)
    python3 benchmarks/diagnose_capture.py 2>&1 | tee "$OUT/diagnose-capture-$tag.txt"
    python3 benchmarks/profile_trainer.py 2>&1 | tee "$OUT/profile-trainer-$tag.txt"
    ;;
train)
    for flag in "" "--no-capture"; do
        name=${flag:-captured}
        python3 -m spikefuse.cli train --dataset shd-synthetic --model shd --batch-size 128 --epochs 3 \
            --quiet $flag --out "/tmp/run-$name" 2>&1 | tail -3
        python3 - "$name" "/tmp/run-$name/metrics.jsonl" <<'EOF' | tee -a "$OUT/train-throughput-$tag.txt"
import json, sys
name, path = sys.argv[1:]
rows = [json.loads(line) for line in open(path)]
print(name, "samples/s per epoch:", [round(r["samples_per_s"]) for r in rows],
      "test acc:", [round(r["test_acc"], 4) for r in rows])
EOF
    done
    ;;
esac
