"""Produces benchmarks/results/cold-start-profile-<gpu>.txt (stdout; on a GPU).

Where a training run's first epoch goes: Trainer.fit's first epoch (captured steps, fp32) on a
task, each Triton compile timed by kernel name with what sets its variant apart, cProfile of that epoch, then the second epoch's
time. Run it twice with one fresh TRITON_CACHE_DIR: the first run is a cold cache (every
kernel compiled), the second a warm one (loaded from disk). Not `bench runs`: no peers, and the
process's own start-up (Triton's driver, the hash of its sources) falls inside the first epoch.

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/profile_cold_start.py shd-synthetic:ipu-shd 48 [background]

"background" trains with Trainer(background_compile=True) (the layers' torch twins run while
their kernels compile; `bench runs` does so on CUDA) and prints how many launches ran a twin.
"""
import cProfile
import pstats
import sys
import time

import triton.compiler as triton_compiler
import triton.compiler.compiler as triton_compiler_module

compiles = []
_compile = triton_compiler_module.compile


def variant(src) -> str:
    """What sets this compile apart: every constexpr by name, and the arguments Triton
    specialized (divisible by 16, equal to 1), by name."""
    fn = getattr(src, "fn", None)
    names = list(getattr(fn, "arg_names", []))

    def named(key):
        index = key[0] if isinstance(key, tuple) and key else key
        return names[index] if isinstance(index, int) and index < len(names) else str(key)
    constexprs = {named(k): v for k, v in (getattr(src, "constants", None) or {}).items()}
    attrs = {named(k): v for k, v in (getattr(src, "attrs", None) or {}).items()}
    return f"constexprs {constexprs} specialized {attrs}"


def timed_compile(src, *args, **kwargs):
    start = time.perf_counter()
    kernel = _compile(src, *args, **kwargs)
    name = getattr(getattr(src, "fn", None), "__name__", None) or type(src).__name__
    compiles.append((name, time.perf_counter() - start, variant(src)))
    return kernel


# JITFunction takes `compile` from triton.compiler at its first launch: replaced before any
triton_compiler.compile = triton_compiler_module.compile = timed_compile

import torch  # noqa: E402

from spikefuse.data import load  # noqa: E402
from spikefuse.models import build_model  # noqa: E402
from spikefuse.ops import launch  # noqa: E402
from spikefuse.train.loop import Trainer  # noqa: E402

task, batch = sys.argv[1], int(sys.argv[2])
background = sys.argv[3:] == ["background"]
dataset, model_name = task.split(":")
splits = load(dataset, device="cuda", progress=False)
torch.cuda.synchronize()
start = time.perf_counter()
model = build_model(model_name, splits.input_shape, splits.num_classes, splits.time_steps,
                    surrogate="fast_sigmoid", alpha=1.0).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, fused=True)
trainer = Trainer(model, splits, optimizer, epochs=1, batch_size=batch, device="cuda", precision="fp32", seed=0,
                  progress=False, background_compile=background)
profiler = cProfile.Profile()
profiler.enable()
trainer.fit()
torch.cuda.synchronize()
profiler.disable()
first = time.perf_counter()
trainer.epochs = 2
trainer.fit()
torch.cuda.synchronize()
second = time.perf_counter()
print(f"{task} B={batch}: first epoch {first - start:.2f} s (model built, compiles, capture), second "
      f"{second - first:.2f} s; compile() {sum(t for _, t, _ in compiles):.2f} s in {len(compiles)} calls"
      + (f"; background compiles: {launch.deferrals()} launches ran a torch twin" if background else ""))
for name, seconds, what in compiles:
    print(f"  compile {seconds:.3f} s {name}: {what}")
pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
