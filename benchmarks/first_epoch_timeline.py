"""Where a first epoch's time goes, step by step (issue 38; stdout; on a GPU).

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/first_epoch_timeline.py shd-synthetic:ipu-shd 48 background [sample] [epochs=N]

Trainer.fit's first epoch (captured, fp32) of TASK at batch B, with background compiles if
"background" is given, after the process's one-time CUDA, cuBLAS/cuDNN and Triton set-up (as
`spikefuse bench runs` pays it before each library's clock). Printed, in seconds since the process started: the epoch's start and
length, every Triton compile (kernel, start, end, thread; "child:" where a forked compile process did
it, the thread then loading it from the cache; also its builds of host C modules with
the system compiler, "build:...", and its kernel loads, "init_handles"), every compile CachedLaunch started
(kernel, arguments as dtype / 16-byte aligned / shape, constexprs), and the training step calls
(start, host time, launches deferred to a torch twin during the call, compiles in flight after
it) where one took over 50 ms or deferred, plus every 20th. Host times: a step's GPU work may
finish later (a captured step's replay returns at once).

With "sample", a thread samples the main thread's stack every 2 ms, and for the time before the
first step, each step call over 0.2 s and the time after the last step (the evaluation) the
script prints the most frequent stacks (innermost frames last): where the host time went.
With "epochs=N", N epochs (the first's length is then printed with each epoch's end).
"""
import collections
import json
import os
import sys
import threading
import time

import torch
import triton.compiler as triton_compiler
import triton.compiler.compiler as compiler_module

T0 = time.perf_counter()
spans, starts, calls = [], [], []
_compile = compiler_module.compile


def timed_compile(src, *args, **kwargs):
    start = time.perf_counter()
    out = _compile(src, *args, **kwargs)
    spans.append((getattr(src, "name", "?"), round(start - T0, 3), round(time.perf_counter() - T0, 3),
                  threading.current_thread().name[:18]))
    return out


triton_compiler.compile = compiler_module.compile = timed_compile


def timed(label, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            if time.perf_counter() - start > 0.001:  # (_init_handles returns at once once done)
                spans.append((label, round(start - T0, 3), round(time.perf_counter() - T0, 3),
                              threading.current_thread().name[:18]))
    return wrapper


# host C modules Triton builds with the system compiler (its driver utilities; launchers in some versions)
import triton.runtime.build as build_module  # noqa: E402
try:
    import triton.backends.nvidia.driver as driver_module
except ImportError:
    driver_module = None
for module in (build_module, driver_module):
    for name in ("compile_module_from_src", "compile_module_from_file", "_build"):
        if module is not None and callable(getattr(module, name, None)):
            setattr(module, name, timed(f"build:{name}", getattr(module, name)))
compiler_module.CompiledKernel._init_handles = timed("init_handles", compiler_module.CompiledKernel._init_handles)

samples = []  # (time, main thread's stack: innermost frames last)


def sample_main_thread(stop: threading.Event, interval: float = 0.002):
    main = threading.main_thread().ident
    while not stop.wait(interval):
        frame, stack = sys._current_frames().get(main), []
        while frame is not None and len(stack) < 40:
            code = frame.f_code
            stack.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        samples.append((time.perf_counter() - T0, tuple(reversed(stack))))


def print_stacks(label, start, end, top=6, depth=14):
    inside = [stack for t, stack in samples if start <= t < end]
    if not inside:
        return
    print(f"  {label}: {end - start:.3f} s, {len(inside)} samples")
    for stack, count in collections.Counter(stack[-depth:] for stack in inside).most_common(top):
        print(f"    {count} x " + " > ".join(stack))


from spikefuse import capture  # noqa: E402  (after the compile hook)
from spikefuse.data import load  # noqa: E402
from spikefuse.models import build_model  # noqa: E402
from spikefuse.ops import launch  # noqa: E402
from spikefuse.train.loop import Trainer  # noqa: E402

try:  # (absent before the compile processes: A/B runs against older sources)
    from spikefuse.ops import compile_processes  # noqa: E402
except ImportError:
    compile_processes = None
else:
    _compile_in_child = compile_processes.compile_in_child

    def compile_in_child(kernel, *args):  # a compile a forked process did (the parent then only loads it)
        start = time.perf_counter()
        done = _compile_in_child(kernel, *args)
        outcome = "done" if done else f"left to the thread ({compile_processes.last_failure[-160:]})"
        spans.append((f"child:{kernel.fn.__name__}:{outcome}", round(start - T0, 3),
                      round(time.perf_counter() - T0, 3), threading.current_thread().name[:18]))
        return done

    compile_processes.compile_in_child = compile_in_child
    compile_processes.start = timed("fork compile processes", compile_processes.start)

_start_compile = launch.CachedLaunch._start_compile


def start_compile(self, key, device, grid, args, meta):
    described = [(str(a.dtype), a.data_ptr() % 16 == 0, tuple(a.shape)) if isinstance(a, torch.Tensor) else a
                 for a in args]
    constexprs = {k: v for k, v in meta.items() if k not in ("num_warps", "enable_fp_fusion")}
    starts.append((round(time.perf_counter() - T0, 3), self.kernel.fn.__name__, described, constexprs))
    return _start_compile(self, key, device, grid, args, meta)


_call = capture.CapturedStep.__call__


def call(self, *inputs):
    start, deferred = time.perf_counter(), launch.deferrals()
    out = _call(self, *inputs)
    calls.append((round(start - T0, 4), round(time.perf_counter() - start, 4), launch.deferrals() - deferred,
                  launch._compiling))
    return out


def main():
    task, batch = sys.argv[1], int(sys.argv[2])
    background = "background" in sys.argv[3:]
    epochs = next((int(a.split("=")[1]) for a in sys.argv[3:] if a.startswith("epochs=")), 1)
    stop = threading.Event()
    if "sample" in sys.argv[3:]:
        threading.Thread(target=sample_main_thread, args=(stop,), daemon=True).start()
    launch.CachedLaunch._start_compile = start_compile
    capture.CapturedStep.__call__ = call
    dataset, net = task.split(":")
    splits = load(dataset, device="cuda", progress=False)
    from spikefuse.bench.runs import warm_device  # as `bench runs` does before a library's clock:
    warm_device(torch.device("cuda"))             # CUDA context, cuBLAS/cuDNN handles, Triton's driver
    torch.cuda.synchronize()
    start = time.perf_counter()
    surrogate = dict(surrogate="fast_sigmoid", alpha=1.0) if net.startswith("ipu") else {}
    model = build_model(net, splits.input_shape, splits.num_classes, splits.time_steps, **surrogate).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, fused=True)
    trainer = Trainer(model, splits, optimizer, epochs=epochs, batch_size=batch, device="cuda", precision="fp32",
                      seed=0, progress=False, background_compile=background)
    for name in ("train_epoch", "evaluate"):  # each epoch's training and evaluation, timed
        setattr(trainer, name, timed(f"Trainer.{name}", getattr(trainer, name)))
    trainer.fit()
    torch.cuda.synchronize()
    end = time.perf_counter()
    stop.set()
    print(json.dumps({"task": task, "background": background, "start": round(start - T0, 3),
                      "compile_processes": compile_processes is not None and compile_processes.enabled(),
                      "first_epoch": round(end - start, 3), "steps": len(calls),
                      "after_last_step": round(end - T0 - sum(calls[-1][:2]), 3) if calls else None,
                      "provisional_graphs": getattr(trainer.step, "provisional_captures", None),
                      "provisional_failure": getattr(trainer.step, "provisional_failure", None)}))
    print("compiles (kernel, start, end, thread):")
    for span in sorted(spans, key=lambda s: s[1]):
        print("  ", span)
    print("compile starts (time, kernel, arguments, constexprs):")
    for entry in starts:
        print("  ", entry)
    print("step calls (index, start, host s, deferred, compiling after):")
    for i, entry in enumerate(calls):
        if entry[1] > 0.05 or entry[2] or i % 20 == 0:
            print("  ", i, entry)
    if samples:
        print("main thread's stacks (most frequent first):")
        print_stacks("before the first step", start - T0, calls[0][0] if calls else end - T0)
        for i, (t, host, *_) in enumerate(calls):
            if host > 0.2:
                print_stacks(f"step {i}", t, t + host)
        if calls:  # the evaluation and the epoch's end
            print_stacks("after the last step", sum(calls[-1][:2]), end - T0)


if __name__ == "__main__":
    main()
