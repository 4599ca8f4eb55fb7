#!/usr/bin/env bash
# `spikefuse bench runs`, one task per GPU, each task pinned to its own share of the host's cores
# (the equivalent of a one-GPU machine per task), cold and then warm: how the README's run-level
# table was measured (benchmarks/results/runs-2026-11-27-s18/, section 3).
#
#     [SEEDS=3] bash benchmarks/runs_per_gpu.sh OUT [TASK ...]
#
# Needs as many GPUs as tasks (default: the four of `bench runs`). For each task at once, on GPU i
# and cores [i*C, (i+1)*C) with C = cores / GPUs: all four libraries from an empty Triton cache
# (OUT/cold-<task>/), then spikefuse and SpikingJelly again from the cache that run filled
# (OUT/warm-<task>/). Why pinned: unpinned, four spikefuse processes starting cold at once on one
# host share its cores with each other's compile processes (section 1 of those results).
# SEEDS (default 3): `--seeds`, each seed's runs from its own empty cache on the cold pass; the
# headline is each library's median time to target over them.
set -uo pipefail
out=${1:?usage: runs_per_gpu.sh OUT [TASK ...]}
shift
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(cifar-synthetic:cifar-medium shd-synthetic:shd shd-synthetic:ipu-shd randman:mlp)
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
[ "$gpus" -ge ${#tasks[@]} ] || { echo "runs_per_gpu.sh: ${#tasks[@]} tasks need as many GPUs, found $gpus" >&2; exit 2; }
share=$(( $(nproc) / gpus ))
caches="$out/triton-caches"  # one per task, below it: new (cold) on the first pass, reused (warm) on the second
seeds=${SEEDS:-3}
mkdir -p "$out"

one_task() {  # gpu task
    local gpu=$1 task=$2 name=${2//:/-} cpus="$(( $1 * share ))-$(( ($1 + 1) * share - 1 ))"
    for pass in cold warm; do
        local libraries=()
        [ "$pass" = warm ] && libraries=(--libraries spikefuse,spikingjelly)
        mkdir -p "$out/$pass-$name"
        CUDA_VISIBLE_DEVICES=$gpu taskset -c "$cpus" python -m spikefuse bench runs --tasks "$task" \
            --seeds "$seeds" "${libraries[@]}" --triton-cache-per-task "$caches" --out "$out/$pass-$name" \
            > "$out/$pass-$name/log.txt" 2>&1
        echo "$(date +%T) $pass $task (GPU $gpu, cores $cpus): exit $? $(grep -h -E 'time to (it|target)' "$out/$pass-$name/log.txt" | tail -1)"
    done
}

for i in "${!tasks[@]}"; do
    one_task "$i" "${tasks[$i]}" &
done
wait
