#!/usr/bin/env bash
# Data-parallel scaling of CIFAR-medium (spikefuse captured / eager, SyncBN / local BN, beside
# SpikingJelly 2.0 under DDP) on 1 GPU and on NGPU GPUs (default 2) under torchrun; results
# under $OUT (the device tool's output folder): ddp-1gpu.json, ddp-<N>gpu.json, their logs,
# and the merged ddp-scaling-<device>.json + .md. About 4 minutes on 2 H200s.
#   bash benchmarks/gpu_ddp.sh
# (`spikefuse bench parallel --parts ddp --gpus N` runs the same, without the per-run limits and logs.)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), 'x', torch.cuda.device_count(), 'NCCL', torch.cuda.nccl.version())"
NGPU=${NGPU:-2}
for n in 1 "$NGPU"; do  # each under its own time limit: a hung rank cannot eat the device slot
    timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" -m spikefuse.bench.parallel_ddp \
        --out "$OUT" 2>&1 | tee "$OUT/ddp-${n}gpu-log.txt"
done
python3 -m spikefuse.bench.parallel_ddp --merge --out "$OUT" 2>&1 | tail -20
