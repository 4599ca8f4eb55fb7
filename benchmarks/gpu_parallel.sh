#!/usr/bin/env bash
# Issue 17 on 2 GPUs: spikefuse train --gpus 2 exits (captured DDP), the temporal pipeline
# (captured) for T = 256..16384 beside the planner, data-parallel CIFAR-medium scaling beside
# SpikingJelly, and DDP with 5 MB buckets. Each part under its own limit; logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), 'x', torch.cuda.device_count(), 'NCCL', torch.cuda.nccl.version())"
start=$(date +%s)
timeout 60 python3 -m spikefuse train --gpus 2 --epochs 1 --quiet --out /tmp/exit 2>&1 | grep -v -i warning | tail -2
echo "spikefuse train --gpus 2: exit code ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee "$OUT/train-gpus2-exit.txt"
timeout ${PIPE_S:-270} python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m spikefuse.bench.parallel_pipeline \
    --out "$OUT" --eager 2>&1 | grep -v -i warning | tee "$OUT/pipeline-log.txt" | grep -v "^ \|^\*\|^Setting"
for n in 1 2; do
    timeout ${DDP_S:-100} python3 -m torch.distributed.run --standalone --nproc-per-node $n -m spikefuse.bench.parallel_ddp \
        --out "$OUT" 2>&1 | grep -v -i warning > "$OUT/ddp-${n}gpu-log.txt"
done
python3 -m spikefuse.bench.parallel_ddp --merge --out "$OUT" 2>&1 | grep "^|"
timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m spikefuse.bench.parallel_ddp --out "$OUT" \
    --modes captured,captured-local-bn --precisions fp32 --bucket-mb 5 --tag -bucket5 --no-check 2>&1 | grep "GPU fp32"
