"""`spikefuse train`: options, config file, run directory, errors; the loop is in loop.py.

Failures are one line (cli.py prints them): UsageError (exit 2) for what the command line
or the run directory's files got wrong, checked before any training; RunError (exit 1) for
faults while running. Ctrl-C stops with where the last checkpoint is (exit 130).

Data parallel (spikefuse.parallel): under torchrun (`torchrun --nproc-per-node N -m spikefuse
train ...`) every process runs this command on its own GPU (its LOCAL_RANK), with temporal
SyncBN; `--gpus N` starts those N processes itself through torch's elastic launcher.
--batch-size stays the global batch, so N GPUs train what one GPU would.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import math
import sys
import time
from pathlib import Path

from ..errors import RunError, UsageError, one_line
from .config import FIELDS, ConfigError, check_path_name, make, read_toml

# options that may accompany --resume: they change where the run goes, not what it computes,
# and --epochs, which extends the run (see _extend_schedule)
RESUME_OPTIONS = {"device": "--device", "capture": "--no-capture",
                  "stop_on_nan": "--[no-]stop-on-nan", "epochs": "--epochs (a new total: extends the run)"}


def _datasets() -> dict:
    try:
        from ..data import DATASETS
        return dict(DATASETS)
    except Exception as e:  # the help must print even if the data package cannot be imported
        return {"(unavailable)": f"spikefuse.data failed to import: {type(e).__name__}: {e}"}


def _models() -> dict:
    from ..models import MODELS
    return {name: description for name, (_, description) in MODELS.items()}


def _listing(title: str, entries: dict) -> str:
    width = max((len(n) for n in entries), default=0)
    lines = [f"  {name:<{width}}  {text}" for name, text in entries.items()] or ["  (none available)"]
    return f"{title}:\n" + "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    datasets, models = _datasets(), _models()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (_listing("data sets", datasets) + "\n\n" + _listing("models", models) +
                     "\n\nA config file holds the same options as TOML keys (batch-size = 128);"
                     "\nthe command line wins over it.")
    add = parser.add_argument
    s = argparse.SUPPRESS  # unset options stay absent, so a config file can supply them
    add("--dataset", default=s, metavar="NAME", help="data set (default: digits; see below)")
    add("--model", default=s, metavar="NAME", help=f"network (default: mlp): {', '.join(models)}")
    add("--epochs", type=int, default=s, metavar="N", help="passes over the training set (default: 20)")
    add("--batch-size", type=int, default=s, metavar="N", help="samples per step (default: 64)")
    add("--lr", type=float, default=s, help="Adam learning rate, cosine-annealed (default: 2e-3)")
    add("--time-steps", type=int, default=s, metavar="T", help="time steps per sample (default: the data set's)")
    add("--device", default=s, help="cpu, cuda, cuda:N or auto (default: auto = cuda if present)")
    # no argparse choices: a bad name is one line from config.make, as every other option's
    add("--precision", default=s, metavar="{fp32,fp32-strict,bf16,fp16}",
        help="fp32: float32, matmuls and convolutions on TF32 tensor cores where the GPU has them; "
             "fp32-strict: IEEE float32 throughout; bf16/fp16: autocast, the rest as fp32 (default: fp32)")
    add("--compile", action="store_true", default=s,
        help="run the model through torch.compile (on CUDA the captured step wraps the compiled model)")
    add("--no-capture", dest="capture", action="store_false", default=s,
        help="on CUDA, issue every training step from Python instead of replaying it as one CUDA graph")
    add("--background-compile", action="store_true", default=s,
        help="on CUDA, while a fused kernel compiles (1-5 s a variant from a cold Triton cache) run its "
             "layer's quick kernels (LIF) or torch twin and go on training; steps are captured once all are "
             "compiled (a run's first steps then depend on compile timing: off, every run takes the same path)")
    add("--clip-grad", type=float, default=s, metavar="NORM", help="clip the gradients' total norm (default: off)")
    add("--sparse", action="store_true", default=s,
        help="sparse training (the ipu-* models): gradient only through neurons that came near threshold "
             "(0.9), the sparse backward where measured activity makes it pay, LazyAdam; starts from the "
             "fluctuation-driven init and, unless --max-rate, --rate-l1 or --rate-log is given, the measured "
             "regulariser --max-rate 0.05 --rate-log 0.05 (docs/sparse.md)")
    add("--max-rate", type=float, default=s, metavar="RATE",
        help="keep each hidden neuron's firing rate (spikes per time step) under RATE: a penalty on the "
             "squared excess, added to the loss inside the step (default: off; 0.05 with --sparse)")
    add("--rate-weight", type=float, default=s, metavar="W", help="the --max-rate penalty's weight (default: 100)")
    add("--rate-l1", type=float, default=s, metavar="W",
        help="add W x each hidden layer's mean firing rate to the loss: it also lowers potentials that come "
             "near threshold without firing, which --sparse's backward would otherwise still carry "
             "(default: 0, off; --rate-l1 0 alone turns --sparse's default regulariser off)")
    add("--rate-log", type=float, default=s, metavar="W",
        help="add W x each hidden layer's mean of log(1 + rate / 0.005) to the loss: it quiets the neurons "
             "that fire rarely and leaves those the task uses (default: 0, off; 0.05 with --sparse)")
    add("--seed", type=int, default=s, help="seeds init, data order and every RNG (default: 0)")
    add("--stop-on-nan", action=argparse.BooleanOptionalAction, default=s,
        help="stop when an epoch's training loss is NaN or infinite, keeping the last finite checkpoint "
             "(default: on)")
    add("--threads", type=int, default=s, metavar="N", help="CPU threads for PyTorch ops, at most 1024 (default: 1)")
    add("--out", default=s, metavar="DIR", help="run directory (default: runs/<dataset>-<model>-<time>)")
    add("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    add("--overwrite", action="store_true",
        help="a new run in an --out that holds another run replaces it (its checkpoint, metrics and "
             "pictures are removed first); without it such a directory is refused")
    add("--config", metavar="FILE", help="TOML file with option values")
    add("--quiet", action="store_true", help="no progress bars")
    add("--gpus", type=int, metavar="N",
        help="train on N GPUs of this machine: N processes (torch's elastic launcher, as torchrun), "
             "gradients averaged during backward, temporal SyncBN; --batch-size is split over them")
    # --debug (print tracebacks) is added to every subcommand by cli.py


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import precision as precisions
    from ..parallel import ddp
    from . import checkpoint, rundir

    cfg, run_dir, state = _options(args)
    overwrite = getattr(args, "overwrite", False)
    if overwrite and args.resume:
        raise UsageError("--overwrite starts a new run over an old one; --resume continues one: pass one of them")
    _check_names(cfg)  # before any slow data loading
    gpus = getattr(args, "gpus", None)
    if gpus is not None and not ddp.launched():
        _check_gpus(cfg, gpus)
        if gpus > 1:  # N processes run this same command line, under the launcher's environment
            return ddp.launch(gpus, getattr(args, "argv", None) or sys.argv[1:])
    dp = _data_parallel(cfg, gpus) if ddp.launched() else None
    try:
        device = str(dp.device) if dp is not None else resolve_device(cfg.device)
        if dp is not None:
            run_dir = dp.broadcast(run_dir)  # rank 0's: a default name holds the time
        with rundir.lock(run_dir):  # a second run on the same directory fails here, at once
            if not args.resume and rundir.holds_run(run_dir):
                if not overwrite:
                    how = (f"continue it with --resume {run_dir}, choose another --out, or pass --overwrite to "
                           "replace it" if (run_dir / checkpoint.FILENAME).exists() else
                           "it stopped before its first checkpoint, so choose another --out or pass --overwrite "
                           "to replace it")
                    raise UsageError(f"{run_dir} already holds a run; {how}")
                if dp is None or dp.is_main:  # told to: the old run's files go before anything is written
                    rundir.clear_run(run_dir)
            threads = torch.get_num_threads()
            # The reference backend's per-step ops are small: one thread is as fast as two on an idle
            # machine, and 10x faster on a busy one, where spinning worker threads wait on each other.
            torch.set_num_threads(cfg.threads)
            try:  # --precision's float32 math for the whole run, the sparse init's forward passes too
                with precisions.applied(cfg.precision):
                    code = _train(cfg, device, run_dir, args, state, dp)
            finally:
                torch.set_num_threads(threads)  # leave the process as we found it (tests call run())
    except RuntimeError as e:
        if dp is not None and ddp.lost_peer(e):
            raise RunError(f"lost contact with the other ranks ({ddp.peer_error(e)}); another rank has "
                           "failed, been killed or hung: its own error says why") from e
        raise
    if dp is not None and code == 0:  # not after a failure: with a peer gone, tearing down could wait on it
        # a CUDA graph that holds NCCL work makes ncclCommDestroy hang (pytorch/pytorch#115388):
        # the trainer's captured steps go first
        gc.collect()
        if torch.cuda.is_initialized():  # a CPU run has no CUDA work, and must not initialize CUDA here
            torch.cuda.synchronize()
        torch.distributed.destroy_process_group()
    return code


def _options(args):
    """(options, run directory, checkpoint state or None) from the command line, config
    file and, with --resume, the run's checkpoint."""
    from . import checkpoint, rundir

    given = {k: v for k, v in vars(args).items() if k in FIELDS}
    state = None
    try:  # --resume '' read as no --resume: a new run, in another directory, exit 0
        check_path_name("--resume", args.resume, f"pass the run directory that holds {checkpoint.FILENAME}",
                        "a run directory")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    try:
        if args.resume is not None:
            run_dir, state = _resume_state(args, given)
            cfg = make(state["config"]["options"], given)
        else:
            cfg = make(read_toml(args.config) if args.config else {}, given)
            run_dir = Path(cfg.out or f"runs/{cfg.dataset}-{cfg.model}-{time.strftime('%Y%m%d-%H%M%S')}")
            reason = rundir.unusable(run_dir)
            if reason is not None:
                raise UsageError(f"--out {run_dir} {reason}; expected a run directory")
    except ConfigError as e:
        where = f"the options saved in {args.resume}/{checkpoint.FILENAME}: " if args.resume else ""
        raise UsageError(where + str(e)) from None
    return cfg, run_dir, state


def _check_gpus(cfg, gpus: int) -> None:
    """--gpus N outside torchrun: N GPUs here, a CUDA device, a batch that splits N ways."""
    import torch

    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus > available:
        raise UsageError(f"--gpus {gpus}: this machine has {available} CUDA GPU{'' if available == 1 else 's'}")
    if cfg.device not in ("auto", "cuda"):
        raise UsageError(f"--gpus runs one process per GPU; drop --device {cfg.device} (or pass cuda)")
    _check_split(cfg, gpus)


def _check_split(cfg, world: int) -> None:
    if cfg.batch_size % world:
        raise UsageError(f"--batch-size {cfg.batch_size} (the global batch) does not split evenly over {world} "
                         f"processes; pass a multiple of {world}")


def _data_parallel(cfg, gpus):
    """This torchrun process's process group and device (spikefuse.parallel)."""
    import os

    from ..parallel import init_data_parallel

    world = int(os.environ["WORLD_SIZE"])
    if gpus is not None and gpus != world:
        raise UsageError(f"--gpus {gpus}, but torchrun started {world} processes; drop --gpus under torchrun")
    _check_split(cfg, world)
    try:
        return init_data_parallel(cfg.device)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _train(cfg, device, run_dir, args, state, dp=None) -> int:
    import contextlib

    import torch

    from . import checkpoint
    from .loop import Trainer

    main = dp is None or dp.is_main  # rank 0 alone prints, plots and writes
    say = print if main else (lambda *_, **__: None)
    checkpoint.seed_everything(cfg.seed)
    with dp.main_first() if dp is not None else contextlib.nullcontext():  # rank 0 fills data caches
        splits = _load_data(cfg, device, progress=not args.quiet)
    _check_memory(cfg, splits, device)
    _check_fit(cfg, splits)
    model_args = {"name": cfg.model, "input_shape": list(splits.input_shape),
                  "num_classes": int(splits.num_classes), "time_steps": int(splits.time_steps),
                  "kwargs": {"sparse": True} if cfg.sparse else {}}
    if state is not None and state["config"].get("model", model_args) != model_args:
        saved = state["config"]["model"]
        raise UsageError(f"cannot resume {run_dir}: its checkpoint holds {_model_text(saved)}, but its saved "
                         f"options now give {_model_text(model_args)}; was {checkpoint.FILENAME} edited, or "
                         "did the data set change?")
    model = _build_model(model_args, cfg.dataset)
    if cfg.sparse and state is None:  # a resumed run's weights come from its checkpoint
        scales = _fluctuation_init(model, splits, device)
        say("fluctuation-driven init for sparse training: hidden weights scaled by "
            + ", ".join(f"{s:.3g}" for s in scales))
    if dp is not None:
        from ..parallel import convert_sync_batchnorm

        convert_sync_batchnorm(model, dp.sync_bn_group)
        if not main:  # the same initial weights everywhere, then a random stream per rank
            checkpoint.seed_everything(dp.rank_seed(cfg.seed))
    if cfg.sparse:  # Adam on the weight rows that got gradient (spikefuse.optim.LazyAdam)
        from ..optim import LazyAdam
        optimizer = LazyAdam(model.parameters(), lr=cfg.lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs)
    trainer = Trainer(model, splits, optimizer, epochs=cfg.epochs, batch_size=cfg.batch_size,
                      scheduler=scheduler, device=device, precision=cfg.precision, compile=cfg.compile,
                      capture=None if cfg.capture else False, clip_grad_norm=cfg.clip_grad,
                      seed=cfg.seed, run_dir=run_dir, progress=not args.quiet, stop_on_nan=cfg.stop_on_nan,
                      config={"options": cfg.as_dict(), "model": model_args}, data_parallel=dp,
                      max_rate=cfg.max_rate, rate_weight=cfg.rate_weight, rate_l1=cfg.rate_l1,
                      rate_log=cfg.rate_log, overwrite=getattr(args, "overwrite", False), background_compile=cfg.background_compile)
    if args.resume:
        try:
            trainer.resume()
        except checkpoint.CheckpointError as e:
            raise UsageError(str(e)) from None
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:  # a state that does not fit
            raise UsageError(f"cannot resume {run_dir}: its checkpoint does not fit the model and optimizer "
                             f"its options build ({one_line(e)})") from None
        saved_epochs = state["config"]["options"].get("epochs")
        if cfg.epochs != saved_epochs:
            trainer.scheduler = _extend_schedule(optimizer, cfg.epochs - trainer.epoch)
            say(f"extending {run_dir} from {saved_epochs} to {cfg.epochs} epochs: the learning rate restarts "
                f"at {cfg.lr:g} and anneals to 0 over the {cfg.epochs - trainer.epoch} epochs left")
        say(f"resuming {run_dir} after epoch {trainer.epoch}/{cfg.epochs}")
    where = device if dp is None else (f"{dp.world_size} processes ({dp.device.type}, "
                                       f"{cfg.batch_size // dp.world_size} samples each per step)")
    say(f"training {cfg.model} on {cfg.dataset} ({len(splits.train)} train / {len(splits.test)} test, "
        f"T={splits.time_steps}) on {where}, {cfg.precision}; run directory {run_dir}")
    start = time.perf_counter()
    try:
        history = trainer.fit()
    except KeyboardInterrupt:
        saved = (f"last checkpoint at epoch {trainer.saved_epoch} in {run_dir}; continue with "
                 f"`spikefuse train --resume {run_dir}`" if trainer.saved_epoch is not None
                 else f"no checkpoint written yet in {run_dir}")
        say(f"spikefuse train: interrupted; {saved}", file=sys.stderr)
        return 130
    except torch.cuda.OutOfMemoryError as e:
        raise RunError(f"out of memory on {device} training {cfg.model} with --batch-size {cfg.batch_size} and "
                       f"{splits.time_steps} time steps ({one_line(e)}); lower --batch-size or --time-steps") from e

    if not main:
        return 0
    # the pictures: Trainer.fit wrote them into run_dir (plots.plot_run)
    final = history[-1]
    saved = "plots, metrics and checkpoint" if importlib.util.find_spec("matplotlib") else "metrics and checkpoint"
    print(f"test accuracy {final['test_acc']:.2%} (loss {final['test_loss']:.4f}) after {final['epoch']} epochs "
          f"in {time.perf_counter() - start:.1f} s; {saved} in {run_dir}")
    return 0


def _extend_schedule(optimizer, epochs: int):
    """The schedule of a run extended by `--resume RUN --epochs N`: a new cosine from the run's
    initial learning rate down to 0 over the epochs left (a warm restart, as in SGDR). The old
    cosine ended near 0 and would rise again past its end; the result is not that of a fresh
    N-epoch run, whose one cosine spans all N epochs."""
    import torch

    for group in optimizer.param_groups:  # start the new cycle where the first one started
        group["lr"] = _set_lr(group["lr"], group["initial_lr"])
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)


def _set_lr(lr, value):
    """A capturable optimizer's tensor learning rate keeps its storage (a captured step reads it)."""
    if hasattr(lr, "fill_"):
        return lr.fill_(value)
    return value


def _model_text(spec: dict) -> str:
    return (f"model {spec.get('name')!r} for input {tuple(spec.get('input_shape', ()))}, "
            f"{spec.get('num_classes')} classes, {spec.get('time_steps')} time steps")


def _resume_state(args, given):
    from . import checkpoint, rundir

    run_dir = Path(args.resume)
    path = run_dir / checkpoint.FILENAME
    reason = rundir.unusable(run_dir)
    if reason is not None:  # a file, a symbolic link loop or to nothing
        raise UsageError(f"cannot resume: --resume {run_dir} {reason}; pass the run directory that holds "
                         f"{checkpoint.FILENAME}")
    if not path.is_file():
        what = "does not exist" if not run_dir.exists() else f"has no {checkpoint.FILENAME}"
        raise UsageError(f"cannot resume: {run_dir} {what}; pass a run directory written by "
                         "`spikefuse train --out DIR`")
    extra = sorted(set(given) - set(RESUME_OPTIONS)) + (["config"] if args.config else [])
    if extra:
        names = ", ".join("--" + k.replace("_", "-") for k in extra)
        raise UsageError(f"--resume continues a run with its saved options; drop {names} "
                         f"(allowed with --resume: {', '.join(RESUME_OPTIONS.values())})")
    try:
        state = checkpoint.load(path)
    except checkpoint.CheckpointError as e:  # a foreign or damaged file: say so in one line
        raise UsageError(str(e)) from None
    options = state.get("config", {}).get("options") if isinstance(state.get("config"), dict) else None
    if not isinstance(options, dict) or not isinstance(state["config"].get("model", {}), dict):
        raise UsageError(f"{path} holds no `spikefuse train` options (config['options'] is missing); "
                         "resume runs written by `spikefuse train`")
    epochs = options.get("epochs")  # checked by config.make later; here only a whole number counts
    wanted = given.get("epochs")
    if wanted is not None and isinstance(epochs, int) and wanted < epochs:
        raise UsageError(f"--epochs {wanted}: {run_dir} is a run of {epochs} epochs; with --resume, --epochs "
                         f"extends a run: pass more than {epochs}, or leave --epochs out to continue it")
    try:  # before the data loads; Trainer.resume checks again
        rundir.check_resume(run_dir, state, epochs if isinstance(epochs, int) and not isinstance(epochs, bool)
                            else None)
    except checkpoint.CheckpointError as e:
        raise UsageError(str(e)) from None
    return run_dir, state


def resolve_device(name: str) -> str:
    """'auto' -> cuda if present, else cpu; anything unavailable is a UsageError."""
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    available = ["auto", "cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(cuda)] if cuda else [])
    if torch.backends.mps.is_available():
        available.append("mps")
    if name == "auto":
        return "cuda" if cuda else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"unknown device {name!r}; available here: {', '.join(available)}") from None
    index_ok = device.index is None or device.index < cuda
    if device.type == "cpu" or (device.type == "cuda" and cuda and index_ok) or \
            (device.type == "mps" and "mps" in available):
        return str(device)
    raise UsageError(f"device {name!r} is not available on this machine; available here: {', '.join(available)}")


def _check_names(cfg):
    from .. import data, refusals
    from ..models import MODELS, trains_sparse

    if cfg.dataset not in data.DATASETS:
        raise UsageError(f"unknown data set {cfg.dataset!r}; expected one of: {', '.join(data.DATASETS)}")
    if cfg.model not in MODELS:
        raise UsageError(f"unknown model {cfg.model!r}; expected one of: {', '.join(MODELS)}")
    if cfg.sparse and not trains_sparse(cfg.model):
        raise UsageError(f"--sparse: model {cfg.model!r} has no sparse training path; the models that have one: "
                         + ", ".join(name for name in MODELS if trains_sparse(name)))
    if cfg.sparse and cfg.compile:
        raise UsageError(refusals.SPARSE_COMPILE)


INIT_SAMPLES = 256  # training samples the fluctuation-driven init measures


def _fluctuation_init(model, splits, device) -> list[float]:
    """IPUNet.fluctuation_init_ on the first training samples, in order (the same batch on
    every rank): the study's own init leaves a hidden layer silent on sparse inputs, and a
    network none of whose potentials reach the cut gets no gradient at all (docs/sparse.md)."""
    x, _ = next(iter(splits.train.batches(min(INIT_SAMPLES, len(splits.train)), shuffle=False)))
    return model.to(device).fluctuation_init_(x.to(device))


def _load_data(cfg, device, progress: bool):
    from .. import data

    try:
        return data.load(cfg.dataset, time_steps=cfg.time_steps, seed=cfg.seed, device=device, progress=progress)
    except (ValueError, OSError, data.DatasetUnavailable) as e:  # bad parameters, files not there
        message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise UsageError(f"cannot load data set {cfg.dataset!r}: {message}") from None


def _check_fit(cfg, splits):
    """Static images (cifar-synthetic) need a model that repeats them over time."""
    from ..models import MODELS, takes_static_images

    if not getattr(splits.train, "time_major", True) and not takes_static_images(cfg.model):
        fitting = ", ".join(name for name in MODELS if takes_static_images(name))
        raise UsageError(f"model {cfg.model!r} does not fit data set {cfg.dataset!r}: its batches are static images "
                         f"[B, {', '.join(map(str, splits.input_shape))}], which only these models take: {fitting}")


def _check_memory(cfg, splits, device):
    """Refuse a batch whose input frames alone outgrow the device (the model's activations,
    a multiple of them, come on top): say so before allocating, not half-way through."""
    from ..data import memory

    shape = tuple(splits.input_shape)
    batch = min(cfg.batch_size, max(len(splits.train), 1))
    nbytes = 3 * 4 * splits.time_steps * batch * math.prod(shape)  # float32 frames, made ahead and in use
    try:
        memory.require(nbytes, device, f"a batch of {batch} x {splits.time_steps} time steps x {shape}",
                       "lower --batch-size or --time-steps")
    except ValueError as e:
        raise UsageError(str(e)) from None


def _build_model(model_args, dataset: str | None = None):
    from ..models import MODELS, build_model

    name, shape = model_args["name"], tuple(model_args["input_shape"])
    default = inspect.signature(MODELS[name][0]).parameters.get("input_shape")
    default = None if default is None or default.default is inspect.Parameter.empty else tuple(default.default)
    source = f"--dataset {dataset!r}" if dataset else "the data"
    try:
        return build_model(name, shape, model_args["num_classes"], model_args["time_steps"], **model_args["kwargs"])
    except (ValueError, TypeError, IndexError) as e:  # the builder cannot take the data's shape
        expects = f"expects input like {default}" if default is not None else "cannot take that shape"
        raise UsageError(f"--model {name!r} does not fit {source}: the data has input shape "
                         f"{shape}, the model {expects} ({one_line(e)})") from None
