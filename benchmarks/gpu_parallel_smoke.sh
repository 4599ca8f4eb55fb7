#!/usr/bin/env bash
# First look at the multi-GPU code on 2 GPUs (short): the link, the two-GPU kernel test,
# spikefuse train --gpus 2, the pipeline at small T, data parallel fp32. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi topo -m 2>&1 | head -8 | tee "$OUT/topo.txt"
env | grep -E "NCCL|MULTICAST|NVSHMEM" | tee -a "$OUT/topo.txt"
SPIKEFUSE_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -x tests/test_kernels_gpu.py -k two_gpus 2>&1 | tail -3
( time timeout 100 python3 -m spikefuse train --gpus 2 --epochs 2 --out /tmp/run2 ) 2>&1 | grep -v Warning | tail -12 | tee "$OUT/train-gpus2.txt"
timeout 170 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m spikefuse.bench.parallel_pipeline \
    --out "$OUT" --time-steps 256 1024 --chunks 4 8 16 32 2>&1 | grep -v Warning | tee "$OUT/pipeline-log.txt"
for n in 1 2; do
    timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node $n -m spikefuse.bench.parallel_ddp \
        --out "$OUT" --precisions fp32 2>&1 | grep -v Warning | tee "$OUT/ddp-${n}gpu-log.txt"
done
python3 -m spikefuse.bench.parallel_ddp --merge --out "$OUT" 2>&1 | tail -20
