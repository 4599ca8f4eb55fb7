"""Shared by compile_time_lif.py and kernel_variants.py (issue 38): ipu-shd's first epochs
from an empty Triton cache, each configuration in a fresh process, alternating.

first_two_epochs(): in this process, Trainer.fit's first and second epoch (captured, fp32,
batch 48) of shd-synthetic:ipu-shd, every Triton compile timed; background compiles (the
layers' torch twins run while their kernels compile) only with COLD_EPOCHS_BACKGROUND=1, with
COLD_EPOCHS_SWITCH_S=S at that GIL switch interval while compiles run (launch.SWITCH_INTERVAL_S
otherwise). table(): runs the children
and prints one markdown row per run.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import torch


def first_two_epochs() -> dict:
    """(first and second epoch seconds, test accuracy after each, every compile's (name, s), how
    many launches ran a torch twin while their kernel compiled)."""
    import triton.compiler as triton_compiler
    import triton.compiler.compiler as compiler_module

    compiles, compile_fn = [], compiler_module.compile

    def timed(src, *args, **kwargs):
        start = time.perf_counter()
        out = compile_fn(src, *args, **kwargs)
        compiles.append((getattr(src, "name", "?"), round(time.perf_counter() - start, 3)))
        return out
    triton_compiler.compile = compiler_module.compile = timed
    from spikefuse.data import load
    from spikefuse.models import build_model
    from spikefuse.ops import launch
    from spikefuse.train.loop import Trainer
    if os.environ.get("COLD_EPOCHS_SWITCH_S"):
        launch.SWITCH_INTERVAL_S = float(os.environ["COLD_EPOCHS_SWITCH_S"])
    splits = load("shd-synthetic", device="cuda", progress=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model = build_model("ipu-shd", splits.input_shape, splits.num_classes, splits.time_steps,
                        surrogate="fast_sigmoid", alpha=1.0).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, fused=True)
    trainer = Trainer(model, splits, optimizer, epochs=1, batch_size=48, device="cuda", precision="fp32", seed=0,
                      progress=False, background_compile=os.environ.get("COLD_EPOCHS_BACKGROUND") == "1")
    first = trainer.fit()[-1]
    torch.cuda.synchronize()
    middle = time.perf_counter()
    trainer.epochs = 2
    second = trainer.fit()[-1]
    torch.cuda.synchronize()
    return {"first_epoch_s": round(middle - start, 3), "second_epoch_s": round(time.perf_counter() - middle, 3),
            "test_acc": [first["test_acc"], second["test_acc"]], "compiles": compiles,
            "deferrals": launch.deferrals()}


def table(title: str, labels: list[str], child, counted) -> None:
    """One row per label, twice over, alternating (the host's speed drifts). child(label):
    (argv, extra env) of a process that prints first_two_epochs()'s JSON as its last line;
    counted(kernel name): whether a compile is one of the kernels weighed."""
    import triton
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, torch {torch.__version__}\n\n"
          f"## Cold first epochs, shd-synthetic:ipu-shd, B=48\n\n| {title} | first epoch s | second s | "
          "LIF compiles | their s | test acc after 1 / 2 | launches deferred |\n|---|---|---|---|---|---|---|",
          flush=True)
    for label in labels + labels:
        argv, env = child(label)
        with tempfile.TemporaryDirectory() as cache:
            out = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                                 env={**os.environ, "TRITON_CACHE_DIR": cache, **env})
        if out.returncode:
            print(f"| {label} | failed: {out.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        seconds = [s for name, s in r["compiles"] if counted(name)]
        print(f"| {label} | {r['first_epoch_s']} | {r['second_epoch_s']} | {len(seconds)} | "
              f"{sum(seconds):.1f} | {r['test_acc'][0]:.4f} / {r['test_acc'][1]:.4f} | {r['deferrals']} |", flush=True)
