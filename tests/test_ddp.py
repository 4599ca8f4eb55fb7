"""Data parallel with temporal SyncBN on torch.distributed, gloo on the CPU: N processes
train exactly what one process trains on the combined batch; `spikefuse train` under a
2-process launch; a dying rank fails the others with a clear error, never a hang.

Ranks are forked from the test process (torch, DDP and spikefuse already imported) where a
fork can run them, spawned elsewhere (helpers.worker_start_method: after CUDA use, on a GPU
machine), except for one run through torch's elastic launcher, the path of `spikefuse train
--gpus N`. They run on the CPU whatever the test device.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo  # noqa: F401  by DDP
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spikefuse.models  # noqa: F401  by `spikefuse train`
from spikefuse.data.dataset import DenseSpikeDataset
from spikefuse.nn import BNLIF, LIF, TemporalBatchNorm1d, TemporalBatchNorm2d
from spikefuse.nn.layers import fold, unfold
from spikefuse.parallel import convert_sync_batchnorm, init_data_parallel
from spikefuse.parallel.ddp import Shard
from spikefuse.train.loop import Trainer
from helpers import worker_start_method

TIMEOUT = 90  # seconds any multi-process test may take before it counts as a hang


# ---- running a function on N gloo ranks ----

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _rank_main(rank, fn, world, port, args, device="cpu"):
    os.environ.update(rank_env(rank, world, port), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dp = init_data_parallel(device)
    try:
        fn(dp, *args)
    finally:
        dist.destroy_process_group()


def on_ranks(world: int, fn, *args, interpreter: bool = False, device: str = "cpu"):
    """fn(DataParallel, *args) in `world` processes (forked where they can be, see
    helpers.worker_start_method); a rank's exception fails the test with its traceback, a
    run past TIMEOUT fails it as a hang. interpreter: fn runs fused kernels on gloo's CPU
    tensors, which needs Triton's interpreter. device "cuda": rank r on GPU r, NCCL."""
    with worker_start_method(interpreter) as start_method:
        context = mp.start_processes(_rank_main, args=(fn, world, free_port(), args, device), nprocs=world,
                                     join=False, start_method=start_method)
    deadline = time.monotonic() + TIMEOUT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"{world} ranks still running after {TIMEOUT} s: a hang")


# ---- N ranks with SyncBN == one process on the combined batch ----

class Net(nn.Module):
    """Static image -> conv -> BNLIF over time (direct encoding), conv -> temporal BN -> LIF,
    linear -> temporal BN1d -> PLIF-style BNLIF with a residual, mean readout: every kind of
    temporal batch norm, each with its own statistics."""

    def __init__(self, backend: str, time_steps: int = 3):
        super().__init__()
        self.time_steps = time_steps
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bnlif1 = BNLIF(4, backend=backend, decay=0.6, threshold=0.5)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)  # a bias before BN gets no gradient
        self.bn2 = TemporalBatchNorm2d(4)
        self.lif2 = LIF(decay=0.6, threshold=0.5)  # no batch norm: its fused kernel is tested elsewhere
        self.fc = nn.Linear(4 * 4 * 4, 5, bias=False)
        self.bn3 = TemporalBatchNorm1d(5)
        self.bnlif3 = BNLIF(5, backend=backend, learn_decay=True, threshold=0.5, surrogate="atan")
        self.readout = nn.Linear(5, 3)

    def forward(self, image):
        T = self.time_steps
        s = self.bnlif1(self.conv1(image), time_steps=T)
        s = self.lif2(self.bn2(unfold(self.conv2(fold(s)), T)))
        h = self.fc(s.flatten(2))
        s = self.bnlif3(h, residual=self.bn3(h))
        return self.readout(s).mean(0)


def close(actual, expected, what, rtol=1e-5):
    """Within rtol relative, with an absolute slack of rtol times the tensor's largest value
    (a gradient entry near zero is a difference of large terms)."""
    slack = rtol * max(expected.abs().max().item(), 1e-12)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=slack, msg=lambda m: f"{what}: {m}")


def _steps_match_one_process(dp, backend, batch, steps, transport="auto"):
    torch.manual_seed(0)
    model = Net(backend).to(dp.device)
    single = copy.deepcopy(model)  # the same initial weights, unconverted
    g = torch.Generator().manual_seed(1)
    images = (torch.randn(batch, 2, 4, 4, generator=g) * 1.5 + 0.3).to(dp.device)
    labels = torch.randint(0, 3, (batch,), generator=g).to(dp.device)
    assert dp.sync_bn_group not in (None, dist.group.WORLD)  # SyncBN's own communicator, as train uses it
    ddp = dp.wrap(convert_sync_batchnorm(model, dp.sync_bn_group, transport=transport))
    mine = slice(dp.rank * batch // dp.world_size, (dp.rank + 1) * batch // dp.world_size)
    for _ in range(steps):  # a second step starts from the first's running statistics
        loss = nn.functional.cross_entropy(single(images), labels)
        single.zero_grad()
        loss.backward()

        local = nn.functional.cross_entropy(ddp(images[mine]), labels[mine])
        model.zero_grad()
        local.backward()
        mean_loss = local.detach().clone()
        dp.sum_(mean_loss)

        close(mean_loss / dp.world_size, loss.detach(), "loss")
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            assert p.grad is not None, name
            close(p.grad, q.grad, f"gradient of {name}")
        for (name, b), c in zip(model.named_buffers(), single.buffers()):
            close(b.double(), c.double(), f"buffer {name}")
        with torch.no_grad():  # the same update on both, so the second step compares again
            for p, q in zip(model.parameters(), single.parameters()):
                p -= 0.5 * p.grad
                q -= 0.5 * q.grad


@pytest.mark.parametrize("world", [2, 3])
def test_sync_bn_reference_equals_one_process_on_the_combined_batch(world):
    on_ranks(world, _steps_match_one_process, "reference", 6, 2)


@pytest.mark.parametrize("world, batch", [(2, 4), (3, 6)])
def test_sync_bn_fused_equals_one_process_on_the_combined_batch(world, batch):
    on_ranks(world, _steps_match_one_process, "fused", batch, 2, interpreter=True)


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("transport", ["nccl", "symmetric"])
def test_sync_bn_fused_on_two_gpus_equals_one_process(transport):
    """On NCCL ranks, through either transport of the statistics (symmetric: peer memory)."""
    on_ranks(2, _steps_match_one_process, "fused", 6, 2, transport, device="cuda")


def _captured_equals_eager(dp, transport):
    """A CUDA graph of forward + backward replays what the eager step computes."""
    from spikefuse.capture import CapturedStep

    torch.manual_seed(0)
    models = [convert_sync_batchnorm(Net("fused").to(dp.device), dp.sync_bn_group, transport=transport)
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    g = torch.Generator().manual_seed(2 + dp.rank)
    batches = [(torch.randn(3, 2, 4, 4, generator=g).to(dp.device), torch.randint(0, 3, (3,), generator=g).to(dp.device))
               for _ in range(2)]

    def stepper(model):
        def step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            model.zero_grad(set_to_none=False)
            loss.backward()
            return loss
        return step
    model_grads = []
    for model, captured in zip(models, (False, True)):
        step = CapturedStep(stepper(model)) if captured else stepper(model)
        for i in range(14):
            loss = step(*batches[i % 2])
        assert not captured or step.captured > 0, "the step was not captured"
        model_grads.append(([p.grad.clone() for p in model.parameters()], loss.detach().clone(),
                            [b.clone() for b in model.buffers()]))
    (eager_grads, eager_loss, eager_bufs), (graph_grads, graph_loss, graph_bufs) = model_grads
    torch.testing.assert_close(graph_loss, eager_loss, rtol=0, atol=0)
    for a, b in zip(graph_grads + graph_bufs, eager_grads + eager_bufs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("transport", ["nccl", "symmetric"])
def test_sync_bn_captured_on_two_gpus_equals_eager(transport):
    on_ranks(2, _captured_equals_eager, transport, device="cuda")


def _transport_refused_on_gloo(dp):
    model = convert_sync_batchnorm(Net("fused"), dp.sync_bn_group, transport="symmetric")
    with pytest.raises(RuntimeError, match="transport='symmetric': it takes CUDA tensors"):
        model(torch.randn(2, 2, 4, 4))


def test_a_transport_that_cannot_serve_is_refused_by_name():
    with pytest.raises(ValueError, match="transport: expected one of auto, nccl, symmetric, got 'nvlink'"):
        convert_sync_batchnorm(Net("reference"), transport="nvlink")
    on_ranks(2, _transport_refused_on_gloo, interpreter=True)


def test_convert_sync_batchnorm_marks_temporal_bn_layers_in_place():
    model = Net("reference")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert convert_sync_batchnorm(model) is model
    synced = {name for name, m in model.named_modules() if getattr(m, "sync", None) is not None}
    assert synced == {"bnlif1", "bn2", "bnlif3", "bn3"}
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert copy.deepcopy(model).bn2.sync is model.bn2.sync  # a process group is shared, not copied


# ---- each rank's slice of each global batch ----

class Indexed:
    """A data set whose sample i is the number i (get/targets as SpikeDataset)."""

    def __init__(self, n):
        self.targets = torch.arange(n)

    def __len__(self):
        return len(self.targets)

    def get(self, idx):
        return idx.float()[None, :, None]  # [T=1, len(idx), 1]


@pytest.mark.parametrize("n, world, batch", [(23, 3, 6), (24, 2, 8), (2, 3, 3)])
def test_shards_cut_the_single_process_batches_into_equal_slices(n, world, batch):
    data = Indexed(n)
    shards = [Shard(data, r, world, pad=True) for r in range(world)]
    per_rank = [list(s.batches(batch, shuffle=True, generator=torch.Generator().manual_seed(5))) for s in shards]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(5))  # what one process draws
    padded = order[torch.arange(-(-n // world) * world) % n]
    steps = list(zip(*per_rank))
    assert len(steps) == -(-len(padded) // batch)
    for step, slices in enumerate(steps):
        assert len({len(y) for _, y in slices}) == 1  # equal slices: DDP's mean is the batch mean
        together = torch.cat([y for _, y in slices])
        assert torch.equal(together, padded[step * batch:(step + 1) * batch])
        assert all(torch.equal(x[0, :, 0].long(), y) for x, y in slices)


def test_evaluation_shards_see_every_sample_once():
    data = Indexed(23)
    seen = torch.cat([y for r in range(3) for _, y in Shard(data, r, 3, pad=False).batches(6, shuffle=False)])
    assert torch.equal(seen.sort().values, torch.arange(23))


def test_data_without_random_access_is_refused_by_name():
    class Streamed:
        def batches(self, batch_size, *, shuffle, generator=None):
            yield from ()
    with pytest.raises(TypeError, match="Streamed has no get or targets"):
        Shard(Streamed(), 0, 2, pad=True)


# ---- the trainer: resume restores every rank ----

def _splits():
    g = torch.Generator().manual_seed(4)
    def split(n):  # rate-coded spikes [T, N, features]; the label is the busiest feature group
        rates = torch.rand(n, 6, generator=g)
        spikes = (torch.rand(3, n, 6, generator=g) < rates).float()
        return DenseSpikeDataset(spikes, rates.view(n, 3, 2).sum(2).argmax(1))
    return SimpleNamespace(train=split(21), test=split(9))  # 21: the last batch is padded


def _resume_matches_uninterrupted(dp, root):
    splits = _splits()

    def trainer(epochs, run_dir):
        torch.manual_seed(0)
        model = convert_sync_batchnorm(nn.Sequential(
            nn.Linear(6, 8), TemporalBatchNorm1d(8), LIF(), nn.Dropout(0.3), nn.Linear(8, 3), MeanOverTime()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        return Trainer(model, splits, optimizer, epochs=epochs, batch_size=8, run_dir=run_dir, seed=3,
                       progress=False, data_parallel=dp)

    full = trainer(3, root / "full").fit()
    trainer(1, root / "cut").fit()
    resumed = trainer(3, root / "cut")
    resumed.resume()  # every rank loads; dropout continues from each rank's own saved RNG state
    history = resumed.fit()
    timeless = [{k: v for k, v in r.items() if not k.endswith(("_per_s", "_time_s"))} for r in history]
    assert timeless == [{k: v for k, v in r.items() if not k.endswith(("_per_s", "_time_s"))} for r in full]
    if dp.is_main:
        assert [r["epoch"] for r in metrics(root / "cut")] == [1, 2, 3]


class MeanOverTime(nn.Module):
    def forward(self, x):
        return x.mean(0)


def test_resumed_data_parallel_training_equals_uninterrupted(tmp_path):
    on_ranks(2, _resume_matches_uninterrupted, tmp_path)


# ---- the command line ----

QUICK = ["--dataset", "digits", "--time-steps", "4", "--batch-size", "64", "--device", "cpu", "--quiet",
         "--seed", "2"]


def metrics(run_dir):
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("samples_per_s", "train_time_s", "epoch_time_s")} for row in rows]


def _cli_rank(rank, world, port, argv, fault, logs):
    """One rank of `spikefuse train` in a forked process, as torchrun would start it."""
    os.environ.update(rank_env(rank, world, port))
    for fd, name in ((1, "stdout"), (2, "stderr")):  # pytest's capture objects stay the parent's
        log = open(logs / f"{name}{rank}", "w", buffering=1)
        os.dup2(log.fileno(), fd)
        setattr(sys, name, log)
    if fault is not None:
        fault()
    from spikefuse.cli import main
    sys.exit(main(argv))


def cli_on_ranks(world, argv, logs: Path, fault=None) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of every rank of `spikefuse train argv` run by `world`
    processes (forked where they can be: torch, DDP and spikefuse already imported)."""
    logs.mkdir(exist_ok=True)
    port = free_port()
    with worker_start_method() as start_method:
        context = mp.get_context(start_method)
        ranks = [context.Process(target=_cli_rank, args=(r, world, port, argv, fault, logs)) for r in range(world)]
        for p in ranks:
            p.start()
    deadline = time.monotonic() + TIMEOUT
    for p in ranks:
        p.join(max(deadline - time.monotonic(), 0))
    if any(p.is_alive() for p in ranks):
        for p in ranks:
            p.kill()
        pytest.fail(f"`spikefuse {' '.join(argv)}` still running after {TIMEOUT} s: a hang")
    return [(p.exitcode, (logs / f"stdout{r}").read_text(), (logs / f"stderr{r}").read_text())
            for r, p in enumerate(ranks)]


def _interrupt_epoch_2():
    from spikefuse.train.loop import Trainer

    train_epoch = Trainer.train_epoch

    def interrupted(self, epoch):
        if epoch == 1:
            raise KeyboardInterrupt  # Ctrl-C on both ranks, at the start of epoch 2
        return train_epoch(self, epoch)
    Trainer.train_epoch = interrupted


def _die_at_step_3():
    """Rank 1 exits abruptly at its third training step (no cleanup, no message)."""
    from spikefuse.train.loop import Trainer

    train_step, calls = Trainer._train_step, [0]

    def dying(self, x, y):
        calls[0] += 1
        if os.environ["RANK"] == "1" and calls[0] == 3:
            os._exit(DIED)
        return train_step(self, x, y)
    Trainer._train_step = dying


DIED = 7


def test_train_on_two_processes_writes_once_and_resumes(tmp_path, capfd):
    """A run through the launcher API (what --gpus uses: `python -m spikefuse train` x 2); a
    second run interrupted in epoch 2 and resumed gives its metrics exactly."""
    from spikefuse.parallel.ddp import launch

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert launch(2, ["train", *QUICK, "--epochs", "2", "--out", str(full)]) == 0
    out = capfd.readouterr().out
    for line in ("training mlp on digits", "2 processes (cpu, 32 samples each", "test accuracy"):
        assert out.count(line) == 1, out  # rank 0 speaks for both
    assert [r["epoch"] for r in metrics(full)] == [1, 2]  # one writer: no line twice
    assert {p.name for p in full.iterdir()} == {".lock", "checkpoint.pt", "metrics.jsonl", "curves.png",
                                                 "raster.png", "firing_rates.png"}
    assert len(torch.load(full / "checkpoint.pt", weights_only=True)["rng_ranks"]) == 2

    ranks = cli_on_ranks(2, ["train", *QUICK, "--epochs", "2", "--out", str(cut)], tmp_path / "a",
                         fault=_interrupt_epoch_2)
    assert [code for code, _, _ in ranks] == [130, 130], ranks  # their output, if not
    assert "interrupted; last checkpoint at epoch 1" in ranks[0][2] and not ranks[1][2]
    assert [r["epoch"] for r in metrics(cut)] == [1]
    ranks = cli_on_ranks(2, ["train", "--resume", str(cut), "--quiet"], tmp_path / "b")
    assert [code for code, _, _ in ranks] == [0, 0], ranks
    assert "resuming" in ranks[0][1] and not ranks[1][1]
    assert metrics(cut) == metrics(full)


def test_gpus_without_enough_gpus_is_a_one_line_usage_error(capsys):
    from spikefuse.cli import main

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert main(["train", "--gpus", str(available + 1)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"--gpus {available + 1}: this machine has {available} CUDA GPU" in err


def test_a_dying_rank_fails_the_others_with_a_clear_error(tmp_path):
    """No launcher to stop the survivor: it must notice by itself, within the timeout."""
    ranks = cli_on_ranks(2, ["train", *QUICK, "--epochs", "1", "--out", str(tmp_path / "run")], tmp_path,
                         fault=_die_at_step_3)
    (code, _, err), (died, _, _) = ranks
    assert died == DIED
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("spikefuse train (rank 0/2): error: lost contact with the other ranks"), err


def test_peer_memory_is_chosen_only_where_every_condition_holds(monkeypatch):
    """transport='auto' decides from facts every rank of one host shares; each missing one is
    the reason given (and transport='symmetric' fails with it)."""
    from spikefuse.parallel import peer_memory

    cuda32 = SimpleNamespace(is_cuda=True, dtype=torch.float32)
    monkeypatch.setattr(peer_memory.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(peer_memory.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(peer_memory.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(peer_memory.torch.cuda, "can_device_access_peer", lambda a, b: True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    from torch.distributed import _symmetric_memory as symm
    if not hasattr(symm, "rendezvous"):
        assert "no torch.distributed._symmetric_memory" in peer_memory.symmetric_unavailable(cuda32, None)
        pytest.skip("this torch has no symmetric memory: the other conditions are not reached")
    assert peer_memory.symmetric_unavailable(cuda32, None) == ""
    assert "CUDA tensors" in peer_memory.symmetric_unavailable(SimpleNamespace(is_cuda=False, dtype=torch.float32), None)
    assert peer_memory.symmetric_unavailable(SimpleNamespace(is_cuda=True, dtype=torch.bfloat16), None) == ""  # autocast's x
    monkeypatch.setattr(peer_memory.torch.cuda, "device_count", lambda: 1)  # two ranks on one GPU
    assert "a GPU of its own" in peer_memory.symmetric_unavailable(cuda32, None)
    monkeypatch.setattr(peer_memory.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(peer_memory.torch.cuda, "can_device_access_peer", lambda a, b: (a, b) != (1, 0))
    assert "peer access" in peer_memory.symmetric_unavailable(cuda32, None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # ranks on two hosts
    assert "every rank on this host" in peer_memory.symmetric_unavailable(cuda32, None)
    monkeypatch.setattr(peer_memory.dist, "get_backend", lambda group=None: "gloo")
    assert "backend is gloo" in peer_memory.symmetric_unavailable(cuda32, None)
