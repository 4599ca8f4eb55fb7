#!/usr/bin/env bash
# A/B of the cold-start opt-ins (issue 38) in `spikefuse bench runs`, spikefuse and SpikingJelly:
#
#     [ROUNDS=2] bash benchmarks/cold_start_ab.sh OUT [TASK ...]
#
# For each task, on its own GPU (tasks beyond the GPU count wait for one), in turn:
# defaults, then SPIKEFUSE_COMPILE_PROCESSES=1 SPIKEFUSE_PROVISIONAL_GRAPHS=1 ("opt-ins"), each from
# an empty Triton cache ("cold") and then from the cache that run filled ("warm"). Results under
# OUT/<variant>/<state>-<task>[-r<round>]/ (bench runs' JSON, markdown and chart); the time to target
# of each is printed as it ends. ROUNDS repeats the whole alternation (variants interleaved, so a
# host's drift hits both). Default tasks: the four of `bench runs`.
set -uo pipefail
out=${1:?usage: cold_start_ab.sh OUT [TASK ...]}
shift
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(shd-synthetic:shd shd-synthetic:ipu-shd randman:mlp cifar-synthetic:cifar-medium)
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
[ "$gpus" -gt 0 ] || { echo "cold_start_ab.sh: no CUDA GPU" >&2; exit 2; }
mkdir -p "$out"
caches=$(mktemp -d)

rounds=${ROUNDS:-1}

one_task() {  # gpu task
    local gpu=$1 task=$2 name=${2//:/-}
    for round in $(seq 1 "$rounds"); do
        local suffix=""
        [ "$rounds" -gt 1 ] && suffix="-r$round"
        for variant in defaults opt-ins; do
            local env=()
            [ $variant = opt-ins ] && env=(SPIKEFUSE_COMPILE_PROCESSES=1 SPIKEFUSE_PROVISIONAL_GRAPHS=1)
            for state in cold warm; do  # warm: the cache the cold run filled
                local dir="$out/$variant/$state-$name$suffix"
                mkdir -p "$dir"
                env "${env[@]}" CUDA_VISIBLE_DEVICES=$gpu TRITON_CACHE_DIR="$caches/$variant-$name$suffix" \
                    python -m spikefuse bench runs --tasks "$task" --libraries spikefuse,spikingjelly \
                    --out "$dir" > "$dir/log.txt" 2>&1
                echo "$variant $state $task$suffix: rc=$? $(grep -h 'time to it' "$dir/log.txt" | sed 's/.*time to it: //')"
            done
        done
    done
}

i=0
for task in "${tasks[@]}"; do
    one_task $((i % gpus)) "$task" &
    i=$((i + 1))
    [ $((i % gpus)) -eq 0 ] && wait
done
wait
rm -rf "$caches"
