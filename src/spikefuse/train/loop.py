"""The training loop: plain PyTorch, one epoch at a time.

    trainer = Trainer(model, splits, optimizer, epochs=20, scheduler=sched, run_dir="runs/x")
    history = trainer.fit()          # list of per-epoch metric dicts

With a run_dir it appends metrics.jsonl and writes checkpoint.pt atomically after every
epoch; `trainer.resume()` continues from that checkpoint bit-for-bit: the data order is
drawn from a generator seeded with seed + epoch, and every RNG state is restored.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import checkpoint, metrics
from .spikes import SpikeMonitor

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Trainer:
    """Trains `model` on `splits.train`, evaluates on `splits.test` after each epoch.

    splits: anything with .train and .test datasets offering
        `batches(batch_size, shuffle=..., generator=...)` -> (x [T, B, ...], y [B]).
    precision: "fp32", or "bf16"/"fp16" autocast (fp16 adds gradient scaling).
    compile: run the forward through torch.compile (checkpoints keep the plain module).
    config: saved in the checkpoint as is (the CLI stores its options there).
    """

    def __init__(self, model: nn.Module, splits, optimizer: torch.optim.Optimizer, *, epochs: int,
                 batch_size: int = 64, scheduler=None, device="cpu", precision: str = "fp32",
                 compile: bool = False, seed: int = 0, run_dir=None, config: dict | None = None,
                 loss_fn=F.cross_entropy, progress: bool = True):
        if precision not in PRECISIONS:
            raise ValueError(f"precision: unknown {precision!r}; expected one of {list(PRECISIONS)}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.forward = torch.compile(self.model) if compile else self.model
        self.splits, self.optimizer, self.scheduler = splits, optimizer, scheduler
        self.epochs, self.batch_size, self.seed = epochs, batch_size, seed
        self.precision, self.loss_fn, self.progress = precision, loss_fn, progress
        self.config = dict(config or {})
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.generator = torch.Generator()  # data order only; reseeded every epoch
        self.epoch = 0  # epochs completed
        self.history: list[dict] = []

    # ---- one pass ----

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=PRECISIONS[self.precision],
                              enabled=self.precision != "fp32")

    def train_epoch(self, epoch: int) -> dict:
        self.model.train()
        self.generator.manual_seed(self.seed + epoch)  # resuming at epoch e replays its order
        data = self.splits.train
        total = len(data)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen, start = 0, time.perf_counter()
        bar = tqdm(total=total, desc=f"epoch {epoch + 1}/{self.epochs}", unit="sample",
                   disable=not self.progress, leave=False, dynamic_ncols=True)
        with SpikeMonitor(self.model) as monitor, bar:
            for step, (x, y) in enumerate(data.batches(self.batch_size, shuffle=True, generator=self.generator)):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                with self._autocast():
                    logits = self.forward(x)
                    loss = self.loss_fn(logits.float(), y)
                self.optimizer.zero_grad(set_to_none=True)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                loss_sum += loss.detach() * len(y)
                correct += (logits.argmax(1) == y).sum()
                seen += len(y)
                bar.update(len(y))
                if step % 10 == 0:  # reading values syncs the device: not every step
                    bar.set_postfix(loss=f"{loss_sum.item() / seen:.3f}", acc=f"{correct.item() / seen:.3f}",
                                    sps=f"{seen / (time.perf_counter() - start):.0f}",
                                    rate=f"{monitor.rate():.3f}")
        elapsed = time.perf_counter() - start
        return {"train_loss": loss_sum.item() / seen, "train_acc": correct.item() / seen,
                "train_rate": monitor.rate(), "samples_per_s": seen / elapsed, "train_time_s": elapsed}

    @torch.no_grad()
    def evaluate(self, data=None) -> dict:
        """Loss, accuracy and per-layer firing rates on `data` (default: the test split)."""
        data = self.splits.test if data is None else data
        self.model.eval()
        loss_sum = torch.zeros((), device=self.device)  # summed on the device: one sync at the end
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen = 0
        with SpikeMonitor(self.model) as monitor:
            for x, y in data.batches(self.batch_size, shuffle=False):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                with self._autocast():
                    logits = self.forward(x).float()
                loss_sum += self.loss_fn(logits, y, reduction="sum")
                correct += (logits.argmax(1) == y).sum()
                seen += len(y)
        return {"test_loss": loss_sum.item() / seen, "test_acc": correct.item() / seen,
                "test_rate": monitor.rate(), "firing_rates": monitor.rates()}

    # ---- the whole run ----

    def fit(self) -> list[dict]:
        for epoch in range(self.epoch, self.epochs):
            record = {"epoch": epoch + 1, "lr": self.optimizer.param_groups[0]["lr"]}
            record.update(self.train_epoch(epoch))
            record.update(self.evaluate())
            if self.scheduler is not None:
                self.scheduler.step()
            self.history.append(record)
            self.epoch = epoch + 1
            if self.run_dir is not None:
                self.save()
                metrics.append(self.run_dir / metrics.FILENAME, record)
            if self.progress:
                tqdm.write(f"epoch {epoch + 1:3d}/{self.epochs}  loss {record['train_loss']:.4f}  "
                           f"train {record['train_acc']:.2%}  test {record['test_acc']:.2%}  "
                           f"rate {record['train_rate']:.3f}  {record['samples_per_s']:.0f} samples/s")
        return self.history

    # ---- checkpoints ----

    def state_dict(self) -> dict:
        return {
            "version": 1,
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "rng": checkpoint.rng_state(self.generator),
            "history": self.history,
            "config": self.config,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        checkpoint.set_rng_state(state["rng"], self.generator)
        self.epoch, self.history = state["epoch"], list(state["history"])

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.save(self.state_dict(), self.run_dir / checkpoint.FILENAME)

    def resume(self) -> None:
        """Load run_dir/checkpoint.pt; metrics.jsonl is cut back to the checkpoint's epochs."""
        state = checkpoint.load(self.run_dir / checkpoint.FILENAME)  # RNG states must stay on the CPU
        self.load_state_dict(state)
        metrics.rewrite(self.run_dir / metrics.FILENAME, self.history)


def fit(model, splits, optimizer, **kwargs) -> list[dict]:
    """Functional shortcut: Trainer(model, splits, optimizer, **kwargs).fit()."""
    return Trainer(model, splits, optimizer, **kwargs).fit()
