"""The training loop: plain PyTorch, one epoch at a time.

    trainer = Trainer(model, splits, optimizer, epochs=20, scheduler=sched, run_dir="runs/x")
    history = trainer.fit()          # list of per-epoch metric dicts

With a run_dir it appends metrics.jsonl and writes checkpoint.pt atomically after every
epoch, holding the run directory's lock (rundir.py) meanwhile, and at the end of fit the
pictures `spikefuse train` gives (plots.py: curves, firing rates, raster); `trainer.resume()` continues
from that checkpoint bit-for-bit: the data order is drawn from a generator seeded with
seed + epoch, and every RNG state is restored. A run_dir that already holds a run (its
checkpoint, or the metrics of a run that stopped before one) is refused unless resumed, or
replaced with overwrite=True (its run files go first: rundir.clear_run).

Data parallel (spikefuse.parallel, one process per GPU under torchrun): pass
`data_parallel=init_data_parallel()`. Each rank trains on its slice of every global batch of
`batch_size` samples, its gradients averaged over the ranks during backward
(parallel.GradientReducer); metrics are summed over the ranks; rank 0 alone logs, writes the
run directory and holds its lock; every rank loads the checkpoint on resume (which holds
every rank's RNG states).
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .. import precision as precisions
from ..errors import RunError
from . import checkpoint, metrics, plots, rundir
from ..nn.sparse_linear import dispatch_report, update_dispatch
from ..capture import CaptureFallback, CapturedStep, prepare_optimizer
from ..ops.launch import background_compiles
from ..optim import steps_each_parameter_alone
from .activity import RateRegularizer, check_rate_options
from .config import (FLOAT32_RANGE, check_count, check_first_step, check_float32, check_kind,
                     check_path_name, check_seed)
from .spikes import SpikeMonitor

if TYPE_CHECKING:  # spikefuse.parallel (torch.distributed) is imported only by those who use it
    from ..parallel.ddp import DataParallel

PRECISIONS = precisions.PRECISIONS


class TrainingDiverged(RunError):
    """An epoch's training loss was NaN or infinite (and stop_on_nan was set)."""


class Trainer:
    """Trains `model` on `splits.train`, evaluates on `splits.test` after each epoch.

    model: maps x [T, B, ...] to [B, C] (logits, rates) or to a time-major [T, B, C] for a
        loss_fn that takes it (spikefuse.loss); accuracy reads [T, B, C] through its mean over time.

    splits: anything with .train and .test datasets offering
        `batches(batch_size, shuffle=..., generator=...)` -> (x [T, B, ...], y [B]); or a
        torch DataLoader yielding (x, y), x batch-first [B, T, ...] as Tonic's PadTensors()
        gives (trained on, no test metrics), or a pair (train_loader, test_loader). Such
        loaders keep their own batch size and order; for time-major loaders pass
        spikefuse.data.loader_splits(train, test, batch_first=False).
    precision: what float32 math and autocast fit(), train_epoch() and evaluate() run in
        (spikefuse.precision; the caller's settings come back afterwards):
        "fp32": float32, matmuls and convolutions on TF32 tensor cores where the GPU has
            them, as `spikefuse train` (PyTorch's default runs matmuls in IEEE float32);
        "fp32-strict": IEEE float32 matmuls and convolutions (TF32 off);
        "bf16"/"fp16": autocast, float32 leftovers as fp32 (fp16 adds gradient scaling).
    compile: run the forward through torch.compile (default mode; checkpoints keep the
        plain module). With capture on, the CUDA graph captures the compiled step: one of
        the two captures, never both.
    capture: run each training step as a CUDA-graph replay (spikefuse.capture);
        None = on for CUDA. The optimizer is prepared for it in place (learning rate as a
        device tensor, capturable state). fp16 trains eagerly: GradScaler decides on the
        host whether to skip a step. Evaluation batches replay a graph of their own
        (`eval_step`, the same memory pool). The last, shorter batch of an epoch gets a
        graph of its own after a few epochs of eager warm-up.
    clip_grad_norm: clip the gradients' total norm to this value before each step.
    stop_on_nan: when an epoch's summed training loss is NaN or infinite, write its metrics
        (non-finite values as null) and raise TrainingDiverged without checkpointing it.
        Checked at the per-epoch read of the device sums: no extra sync. False trains on.
    max_rate, rate_weight: keep hidden activity low (spikefuse.train.activity.RateRegularizer):
        rate_weight * the squared excess of each neuron's firing rate over max_rate, averaged
        per layer, added to the loss inside the step; its epoch mean is `rate_penalty` in the
        metrics (train_loss stays the task's). None: no such term.
    rate_l1: weight of an L1 term on spikes (each layer's mean firing rate), which also lowers
        potentials that come near threshold without firing (RateRegularizer); 0: none.
    rate_log: weight of a log term on each neuron's rate, which quiets the rarely firing
        neurons first (RateRegularizer); 0: none.
    background_compile: while a fused kernel compiles (from a cold Triton cache, 1-5 s a
        variant), its layer runs its pure-PyTorch twin (same spikes, gradients within 1e-5;
        slower, and it keeps more for backward), or a LIF layer quick kernels that compile
        sooner (ops/lif.py QUICK_K), and training goes on; the steps are captured
        once every kernel is compiled. Off by default: a run's first steps would then depend on
        how fast its kernels compile, and a seed would no longer fix a run bit for bit (nor a
        resumed run match an uninterrupted one). One process only (not with data_parallel).
    config: saved in the checkpoint as is (the CLI stores its options there).
    overwrite: a run_dir holding another run is refused (ValueError) unless this is True;
        then fit removes that run's files (checkpoint, metrics, pictures) before it starts.
    data_parallel: this process's spikefuse.parallel.DataParallel, or None (one process).
        batch_size is then the global batch, split evenly over the ranks (it must divide);
        rank 0's weights are copied to every rank; convert the model to SyncBN where wanted
        (convert_sync_batchnorm). Captured steps capture the gradient all-reduce too, after
        data_parallel.reducer_warmup eager steps.
    """

    def __init__(self, model: nn.Module, splits, optimizer: torch.optim.Optimizer, *, epochs: int,
                 batch_size: int = 64, scheduler=None, device="cpu", precision: str = "fp32",
                 compile: bool = False, capture: bool | None = None, clip_grad_norm: float | None = None,
                 seed: int = 0, run_dir=None, config: dict | None = None,
                 loss_fn=F.cross_entropy, progress: bool = True, stop_on_nan: bool = True,
                 data_parallel: DataParallel | None = None, max_rate: float | None = None,
                 rate_weight: float = 100.0, rate_l1: float = 0.0, rate_log: float = 0.0, overwrite: bool = False,
                 background_compile: bool = False):
        # the CLI's checks (train.config), under these keywords' names: one rule for fit and the CLI
        # (epochs 2**70 trained forever and NaN failed in range(); a NaN or 2**70 seed inside
        # torch.manual_seed; a truthy string switched compile or capture on)
        epochs, batch_size = check_count("epochs", epochs), check_count("batch_size", batch_size)
        seed = check_seed("seed", seed)
        run_dir = check_path_name("run_dir", run_dir, "pass run_dir=None to write nothing")
        for label, flag in (("overwrite", overwrite), ("compile", compile), ("stop_on_nan", stop_on_nan),
                            ("progress", progress), ("capture", False if capture is None else capture),
                            ("background_compile", background_compile)):
            check_kind(label, bool, flag)
        precisions.check(precision)
        if clip_grad_norm is not None:
            clip_grad_norm = check_float32("clip_grad_norm", clip_grad_norm)
        for i, group in enumerate(getattr(optimizer, "param_groups", [])):
            lr = group.get("lr")  # a tensor lr (capturable optimizers) is the caller's to keep finite: no sync
            if isinstance(lr, (int, float)) and not (0 <= lr <= FLOAT32_RANGE[1]):  # NaN fails too
                raise ValueError(f"optimizer: parameter group {i} has learning rate {lr!r}; expected a finite "
                                 "number >= 0 in float32's range (training would make every weight NaN)")
            beta1 = (group.get("betas") or (None,))[0]  # Adam's kin: the first step is lr / (1 - beta1)
            if isinstance(lr, (int, float)) and isinstance(beta1, float) and 0 <= beta1 < 1:
                try:
                    check_first_step("lr", lr, beta1)
                except ValueError as e:
                    raise ValueError(f"optimizer: parameter group {i}'s {e}") from None
        if data_parallel is not None and batch_size % data_parallel.world_size:
            raise ValueError(f"batch_size: {batch_size} does not split evenly over {data_parallel.world_size} "
                             "processes; pass a multiple of the world size (it is the global batch)")
        if not (hasattr(splits, "train") and hasattr(splits, "test")):  # DataLoaders
            from ..data.foreign import as_splits
            splits = as_splits(splits)
        if data_parallel is not None and not getattr(splits.train, "shardable", True):
            raise ValueError("splits: DataLoaders are not sharded over processes; under data_parallel "
                             "pass spikefuse.data.load(...)'s splits")
        check_rate_options(0.0 if max_rate is None else max_rate, rate_weight, rate_l1, rate_log)
        self.device = torch.device(device)
        if background_compile and data_parallel is not None:  # ranks must capture the same step
            raise ValueError("background_compile: not under data_parallel (every rank must capture the same "
                             "step, and each would run its layers' torch twins for as long as its compiles take)")
        self.background_compile = background_compile
        self.model = model.to(self.device)
        self.parallel = data_parallel
        self.main = data_parallel is None or data_parallel.is_main  # logs and writes the run directory
        self.splits, self.optimizer, self.scheduler = splits, optimizer, scheduler
        self.epochs, self.batch_size, self.seed = epochs, batch_size, seed
        self.precision, self.loss_fn, self.progress = precision, loss_fn, progress and self.main
        self.clip_grad_norm, self.stop_on_nan = clip_grad_norm, stop_on_nan
        self.config = dict(config or {})
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.overwrite = overwrite
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.generator = torch.Generator()  # data order only; reseeded every epoch
        self.epoch = 0  # epochs completed
        self.saved_epoch: int | None = None  # the epoch run_dir's checkpoint holds, once known
        self.history: list[dict] = []
        # per epoch: summed loss, correct predictions, summed rate penalty; on the device, updated in the step
        self.sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self.monitors = {mode: SpikeMonitor(self.model, mode=mode, device=self.device) for mode in ("train", "eval")}
        self.regularizer = (RateRegularizer(self.model, max_rate, rate_weight, rate_l1, rate_log)
                            if max_rate is not None or rate_l1 or rate_log else None)
        captured = self._capture_wanted(capture)
        # one side stream for the warm-ups and the capture
        stream = torch.cuda.Stream(self.device) if captured else None
        # the reducer steps the optimizer bucket by bucket (overlapping backward) where the update needs
        # no gradient but a parameter's own: clipping wants the global norm first, fp16 scaling every
        # gradient's inf check
        overlap = clip_grad_norm is None and precision != "fp16" and steps_each_parameter_alone(optimizer)
        self.reducer = (data_parallel.reducer(self.model, optimizer=self.optimizer if overlap else None)
                        if data_parallel is not None else None)
        compiled = torch.compile if compile else (lambda module: module)
        # evaluation runs the same model: no collectives (ranks may evaluate unequal batch counts)
        self.forward = self.eval_forward = compiled(self.model)
        # under data parallel every rank captures the same step: all replay, or all run eagerly
        ranks = {} if self.reducer is None else {"warmup": data_parallel.reducer_warmup,
                                                 "agree_across": data_parallel.group or torch.distributed.group.WORLD}
        # training and evaluation steps share one graph memory pool: they never run at once
        pool = torch.cuda.graph_pool_handle() if captured else None
        self._new_step = lambda: CapturedStep(self._train_step, enabled=captured, stream=stream, pool=pool, **ranks)
        self.step = self._new_step()
        # evaluation batches replay a graph too (no collectives in it: each rank captures its own); from a
        # cold cache this is where stand-ins ran eagerly, host-bound (0.4-0.5 s of a T=100 first epoch)
        self.eval_step = CapturedStep(self._eval_logits, enabled=captured, name="evaluation", stream=stream,
                                      pool=pool)

    def _capture_wanted(self, capture) -> bool:
        if capture is None:
            capture = self.device.type == "cuda"
        if not capture:
            return False
        reason = ("fp16 gradient scaling decides on the host (GradScaler reads .item()) whether to skip "
                  "a step" if self.precision == "fp16" else None)
        if reason is None and self.device.type != "cuda":
            reason = f"CUDA graphs need a CUDA device, the trainer runs on {self.device}"
        reason = reason or prepare_optimizer(self.optimizer)
        if reason is not None:
            warnings.warn(f"training steps run eagerly, not as CUDA graphs: {reason}", CaptureFallback, stacklevel=3)
            return False
        return True

    # ---- one pass ----

    def _autocast(self):
        # no weight-cast cache: a cache entry made while capturing would outlive its graph
        dtype = precisions.autocast_dtype(self.precision)
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None,
                              cache_enabled=False)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward, backward, optimizer step and metric sums: only tensor work, so that
        CapturedStep can record it in one CUDA graph."""
        if self.reducer is not None:
            self.reducer.sync_buffers()  # rank 0's running statistics of unsynchronised BN layers, if any
        with self._autocast():
            logits = self.forward(x)
            self._check_output(logits, y)
            loss = self.loss_fn(logits.float(), y)
        penalty = self.regularizer.take(self.device) if self.regularizer is not None else None
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss if penalty is None else loss + penalty).backward()
        if self.reducer is not None:
            self.reducer.finish()  # gradients averaged over the ranks (and stepped, where it holds the optimizer)
        if self.reducer is None or self.reducer.optimizer is None:
            if self.clip_grad_norm is not None:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm, foreach=True)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        with torch.no_grad():
            self.sums[0].add_(loss.detach().double() * y.shape[0])
            self.sums[1].add_((metrics.predicted(logits) == y).sum())
            if penalty is not None:
                self.sums[2].add_(penalty.detach().double() * y.shape[0])
        return loss

    def _eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.eval_forward(x).float()

    def _check_output(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        """A time-major [T, B, C] output under the default loss, which takes [B, C]: one line
        naming loss_fn, not cross_entropy's 'Expected input batch_size (T) to match target
        batch_size (B)'. Shapes only: no device sync, nothing in a captured graph."""
        if self.loss_fn is F.cross_entropy and logits.dim() == 3 and y.dim() == 1:
            raise ValueError(f"loss_fn: the model returns a time-major [T, B, C] {tuple(logits.shape)}, but the "
                             "default loss_fn (cross_entropy) takes [B, C]; pass loss_fn="
                             "spikefuse.loss.membrane_cross_entropy (or rate_cross_entropy, count_mse), "
                             "or average over time in the model (.mean(0))")

    def train_epoch(self, epoch: int) -> dict:
        with precisions.applied(self.precision):  # also when called alone, not from fit
            return self._train_epoch(epoch)

    def _train_epoch(self, epoch: int) -> dict:
        self.model.train()
        self.generator.manual_seed(self.seed + epoch)  # resuming at epoch e replays its order
        data = self._share(self.splits.train, pad=True)
        total, world = len(self.splits.train), self._world()
        self.sums.zero_()
        monitor = self.monitors["train"]
        monitor.reset()
        progress = _Progress(self.sums, self.device, world)
        seen, start = 0, time.perf_counter()
        bar = tqdm(total=total, desc=f"epoch {epoch + 1}/{self.epochs}", unit="sample",
                   disable=not self.progress, leave=False, dynamic_ncols=True)
        with self._watching(), bar:
            for step, (x, y) in enumerate(data.batches(self.batch_size, shuffle=True, generator=self.generator)):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                self.step(x, y)
                seen += len(y)
                bar.update(len(y) * world)
                if step % 10 == 0 and not bar.disable:
                    progress.show(bar, seen, start)
        if self.parallel is not None:
            self.parallel.sum_(self.sums, monitor.counts)
            seen *= world  # every rank's slices are equally long
        loss_sum, correct, penalty_sum = self.sums.tolist()  # the epoch's one sync
        elapsed = time.perf_counter() - start
        record = {"train_loss": loss_sum / seen, "train_acc": correct / seen, "train_rate": monitor.rate(),
                  "train_firing_rates": monitor.rates(), "samples_per_s": seen / elapsed, "train_time_s": elapsed}
        if self.regularizer is not None:
            record["rate_penalty"] = penalty_sum / seen
        return record

    def evaluate(self, data=None) -> dict:
        """Loss, accuracy and per-layer firing rates on `data` (default: the test split)."""
        with precisions.applied(self.precision):  # also when called alone, not from fit
            return self._evaluate(data)

    @torch.no_grad()
    def _evaluate(self, data) -> dict:
        data = self.splits.test if data is None else data
        if data is None:
            raise ValueError("data: no test split to evaluate (splits were given as one DataLoader)")
        if isinstance(data, torch.utils.data.DataLoader):
            from ..data.foreign import as_split
            data = as_split(data)
        if len(data) == 0:
            raise ValueError("data: no samples to evaluate (an empty split)")
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)  # summed on the device: one sync at the end
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen = 0
        monitor = self.monitors["eval"]
        monitor.reset()
        with self._watching():
            for x, y in self._share(data, pad=False).batches(self.batch_size, shuffle=False):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                logits = self.eval_step(x)  # overwritten by the next call: used up below first
                self._check_output(logits, y)
                loss_sum += self.loss_fn(logits, y, reduction="sum")
                correct += (metrics.predicted(logits) == y).sum()
                seen += len(y)
        if self.parallel is not None:
            self.parallel.sum_(loss_sum, correct, monitor.counts)
            seen = self.parallel.total(seen)
        return {"test_loss": loss_sum.item() / seen, "test_acc": correct.item() / seen,
                "test_rate": monitor.rate(), "firing_rates": monitor.rates()}

    def _share(self, data, pad: bool):
        """This rank's slices of `data`'s batches (all of them in a single process)."""
        return data if self.parallel is None else self.parallel.shard(data, pad=pad)

    def _world(self) -> int:
        return 1 if self.parallel is None else self.parallel.world_size

    @contextlib.contextmanager
    def _watching(self):
        """Both monitors' hooks attached (once: fit keeps them for the whole run, so the
        hooks a compiled model traced stay the same), detached again by whoever attached."""
        if self.monitors["train"].handles:
            yield
            return
        with self.monitors["train"], self.monitors["eval"], self.regularizer or contextlib.nullcontext():
            yield

    # ---- the whole run ----

    def fit(self) -> list[dict]:
        for name in ("train", "test"):
            split = getattr(self.splits, name)
            if split is not None and len(split) == 0:  # a test split of None: train only
                raise ValueError(f"splits.{name}: the split is empty; fit needs at least one sample in "
                                 "both the train and the test split")
        with (self._locked(), self._watching(), precisions.applied(self.precision),
              background_compiles(self.background_compile)):
            # a new run never appends to another's metrics nor replaces its checkpoint; this
            # Trainer's own earlier fit, or its resume(), set saved_epoch (every rank checks alike)
            if self.run_dir is not None and self.saved_epoch is None and rundir.holds_run(self.run_dir):
                if not self.overwrite:
                    raise ValueError(f"run_dir: {self.run_dir} already holds a run (its {checkpoint.FILENAME} or "
                                     f"{metrics.FILENAME}); continue it with trainer.resume(), pass another "
                                     "run_dir, or overwrite=True to replace it")
                if self.main:  # told to: the old run's files go, under the lock, before anything is written
                    rundir.clear_run(self.run_dir)
            return self._fit()

    def _locked(self):
        if self.run_dir is None or not self.main:
            return contextlib.nullcontext()
        return rundir.lock(self.run_dir)

    def _fit(self) -> list[dict]:
        for epoch in range(self.epoch, self.epochs):
            start = time.perf_counter()
            record = {"epoch": epoch + 1, "lr": float(self.optimizer.param_groups[0]["lr"])}
            record.update(self.train_epoch(epoch))
            if self.stop_on_nan and not math.isfinite(record["train_loss"]):
                self._diverged(record)
            if self.splits.test is not None:
                record.update(self.evaluate())
            if update_dispatch(self.model):  # a sparse layer switched backward: capture again
                self.step = self._new_step()
            dispatched = dispatch_report(self.model)
            if dispatched:  # what the sparse layers measured this epoch, and the backward each takes next
                record["sparse_layers"] = dispatched
            # training, evaluation, dispatch and re-capture: what a time-to-accuracy curve adds up
            record["epoch_time_s"] = time.perf_counter() - start
            if self.scheduler is not None:
                self.scheduler.step()
            self.history.append(record)
            self.epoch = epoch + 1
            if self.run_dir is not None:
                self.save()
                if self.main:
                    metrics.append(self.run_dir / metrics.FILENAME, record)
            if self.progress:
                tqdm.write(f"epoch {epoch + 1:3d}/{self.epochs}  loss {record['train_loss']:.4f}  "
                           f"train {record['train_acc']:.2%}  test {record.get('test_acc', math.nan):.2%}  "
                           f"rate {record['train_rate']:.3f} {_layer_rates(record['train_firing_rates'])}  "
                           f"{record['samples_per_s']:.0f} samples/s")
        if self.run_dir is not None and self.main and self.history:  # the pictures `spikefuse train` gives
            shown = self.splits.test if self.splits.test is not None else self.splits.train
            plots.plot_run(self.run_dir, self.history, self.model, shown, self.device)
        return self.history

    def _diverged(self, record: dict):
        """Write the diverged epoch's metrics (as null), keep the last finite checkpoint, raise."""
        if self.run_dir is not None and self.main:
            metrics.append(self.run_dir / metrics.FILENAME, record)
        kept = ("" if self.run_dir is None else f" (last checkpoint: epoch {self.saved_epoch} in {self.run_dir})"
                if self.saved_epoch is not None else f" (no checkpoint in {self.run_dir} yet)")
        raise TrainingDiverged(f"training diverged: the training loss of epoch {record['epoch']} is "
                               f"{record['train_loss']}; stopped{kept}; lower the learning rate, clip "
                               "gradients, or pass --no-stop-on-nan (stop_on_nan=False) to train on")

    # ---- checkpoints ----

    def state_dict(self) -> dict:
        """The whole training state; under data parallel a collective (every rank calls it:
        `rng_ranks` gathers each rank's RNG states, `rng` is this rank's)."""
        rng = checkpoint.rng_state(self.generator)
        state = {
            "version": checkpoint.VERSION,
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "rng": rng,
            "history": self.history,
            "config": self.config,
        }
        if self.parallel is not None:
            state["rng_ranks"] = self.parallel.all_gather(rng)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.step.enabled:  # the saved learning rate and step counters come back on the CPU
            prepare_optimizer(self.optimizer)
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        if self.parallel is not None:  # this rank's states, if it was one of the ranks saved
            ranks = state.get("rng_ranks") or [state["rng"]]
            rng = ranks[self.parallel.rank] if self.parallel.rank < len(ranks) else None
        if rng is not None:  # a rank that was not saved keeps its own seeded states
            checkpoint.set_rng_state(rng, self.generator)
        self.epoch, self.history = state["epoch"], list(state["history"])

    def save(self) -> None:
        """Write run_dir/checkpoint.pt (rank 0); under data parallel every rank calls it."""
        state = self.state_dict()
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            checkpoint.save(state, self.run_dir / checkpoint.FILENAME)
        self.saved_epoch = self.epoch

    def resume(self) -> None:
        """Load run_dir/checkpoint.pt; metrics.jsonl is cut back to the checkpoint's epochs.
        A checkpoint that cannot be resumed as it is (rundir.check_resume: format version, epoch,
        history, metrics.jsonl of another run) raises checkpoint.CheckpointError, changing nothing."""
        with self._locked():
            state = checkpoint.load(self.run_dir / checkpoint.FILENAME)  # RNG states must stay on the CPU
            rundir.check_resume(self.run_dir, state, self.epochs)  # before any state is touched
            self.load_state_dict(state)
            self.saved_epoch = self.epoch
            if self.main:
                metrics.rewrite(self.run_dir / metrics.FILENAME, self.history)


class _Progress:
    """The progress bar's loss and accuracy without waiting for the GPU: the device sums
    are copied to pinned host memory behind an event and shown once the copy has landed.
    Under data parallel they are rank 0's (its loss and accuracy; samples/s times `world`)."""

    def __init__(self, sums: torch.Tensor, device: torch.device, world: int = 1):
        self.sums, self.cuda, self.world = sums, device.type == "cuda", world
        self.host = torch.zeros(sums.shape, dtype=sums.dtype, pin_memory=self.cuda)
        self.seen = 0  # samples the copy in flight covers
        self.event = torch.cuda.Event() if self.cuda else None
        self.pending = False

    def show(self, bar, seen: int, start: float):
        if self.cuda and self.pending and not self.event.query():
            return  # the last copy has not landed: try again at the next call
        if self.pending and self.seen:
            loss_sum, correct = self.host.tolist()[:2]
            bar.set_postfix(loss=f"{loss_sum / self.seen:.3f}", acc=f"{correct / self.seen:.3f}",
                            sps=f"{seen * self.world / (time.perf_counter() - start):.0f}", refresh=False)
        self.host.copy_(self.sums, non_blocking=self.cuda)
        self.seen, self.pending = seen, True
        if self.cuda:
            self.event.record()


def _layer_rates(rates: dict) -> str:
    """The per-layer firing rates of an epoch line: each layer's, or their range when many."""
    if not rates:
        return ""
    values = list(rates.values())
    if len(values) <= 6:
        return "[" + " ".join(f"{r:.3f}" for r in values) + "]"
    return f"[{min(values):.3f}-{max(values):.3f} over {len(values)} layers]"


def fit(model, splits, optimizer, **kwargs) -> list[dict]:
    """Functional shortcut: Trainer(model, splits, optimizer, **kwargs).fit()."""
    return Trainer(model, splits, optimizer, **kwargs).fit()
