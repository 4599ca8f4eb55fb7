"""GradientReducer (spikefuse.parallel.grad_reduce): N ranks' averaged gradients equal one
process's on the combined batch, step after step (the buckets are cut again after the first),
with SyncBN, parameters without gradient, unsynchronised buffers and any bucket size; on two
GPUs a captured step replays the eager one bit for bit. gloo on the CPU unless marked."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from spikefuse.parallel import GradientReducer, convert_sync_batchnorm
from test_ddp import Net, close, on_ranks


class WithSpare(nn.Module):
    """A net with a parameter that gets no gradient, a channels-last weight (its gradient is
    all-reduced as it is, not in a flat bucket) and a BN layer that is not synchronised (in
    eval mode: on a slice its batch statistics would differ from the combined batch's)."""

    def __init__(self):
        super().__init__()
        self.net = Net("reference")
        self.bn = nn.BatchNorm1d(3)
        self.spare = nn.Parameter(torch.ones(4))
        self.net.conv2.to(memory_format=torch.channels_last)
        self.bn.eval()

    def forward(self, x):
        return self.bn(self.net(x))


def _matches_one_process(dp, bucket_mb, batch=6, steps=3):
    torch.manual_seed(dp.rank)  # different weights per rank: the reducer copies rank 0's
    model = WithSpare()
    torch.manual_seed(0)
    single = WithSpare()
    if dp.rank == 0:
        model.load_state_dict(single.state_dict())
    model.net = convert_sync_batchnorm(model.net, dp.sync_bn_group)
    reducer = dp.reducer(model, bucket_mb=bucket_mb)
    assert [b.data_ptr() for b in reducer.buffers] == [b.data_ptr() for b in model.bn.buffers()]
    g = torch.Generator().manual_seed(1)
    mine = slice(dp.rank * batch // dp.world_size, (dp.rank + 1) * batch // dp.world_size)
    for step in range(steps):  # step 0 learns the ready order; later steps use the new buckets
        images = torch.randn(batch, 2, 4, 4, generator=g) * 1.5 + 0.3
        labels = torch.randint(0, 3, (batch,), generator=g)
        single.zero_grad()
        loss = nn.functional.cross_entropy(single(images), labels)
        loss.backward()
        single.spare.grad = torch.zeros_like(single.spare)

        model.zero_grad(set_to_none=True)
        reducer.sync_buffers()
        local = nn.functional.cross_entropy(model(images[mine]), labels[mine])
        local.backward()
        reducer.finish()
        assert not model.net.conv2.weight.grad.is_contiguous()  # its own all-reduce, its own layout
        assert reducer.transport_in_use == "nccl"  # (gloo: torch.distributed's all-reduce)
        for (name, p), q in zip(model.named_parameters(), single.parameters()):
            close(p.grad, q.grad, f"step {step}, gradient of {name}")
        with torch.no_grad():
            for p, q in zip(model.parameters(), single.parameters()):
                p -= 0.5 * p.grad
                q -= 0.5 * q.grad
    assert reducer.first_order is None and sum(len(b) for b in reducer.buckets) == len(reducer.params)


@pytest.mark.parametrize("world, bucket_mb", [(2, 4.0), (3, 1e-6), (2, 1e-4)])
def test_averaged_gradients_equal_one_process(world, bucket_mb):
    on_ranks(world, _matches_one_process, bucket_mb)


def _peer_equals_nccl(dp, bucket_mb, share_bytes, steps=3, batch=6):
    """The same steps through both transports: the averaged gradients agree bit for bit (on two
    ranks both are (a + b) / 2 exactly)."""
    from spikefuse.parallel import grad_peer

    grad_peer.SHARE_BYTES = share_bytes
    torch.backends.cudnn.deterministic = True  # both models' own gradients bit for bit alike
    torch.manual_seed(0)
    models = [WithSpare().to(dp.device)]
    models.append(copy.deepcopy(models[0]))
    reducers = [dp.reducer(m, bucket_mb=bucket_mb, transport=t) for m, t in zip(models, ("nccl", "peer"))]
    g = torch.Generator().manual_seed(1)
    mine = slice(dp.rank * batch // dp.world_size, (dp.rank + 1) * batch // dp.world_size)
    for step in range(steps):
        images = (torch.randn(batch, 2, 4, 4, generator=g) * 1.5 + 0.3).to(dp.device)
        labels = torch.randint(0, 3, (batch,), generator=g).to(dp.device)
        for model, reducer in zip(models, reducers):
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images[mine]), labels[mine]).backward()
            reducer.finish()
        if step:  # (the first step, which cuts the buckets, is torch.distributed's)
            assert [r.transport_in_use for r in reducers] == ["nccl", "peer"]
        for (name, p), q in zip(models[1].named_parameters(), models[0].parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=lambda m: f"step {step}, {name}: {m}")
            assert p.grad.stride() == p.stride(), name  # the parameter's layout, as fused optimizers need
        with torch.no_grad():
            for model in models:
                for p in model.parameters():
                    p -= 0.5 * p.grad


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("bucket_mb, share_bytes", [(4.0, 0), (1e-4, 0), (1e-4, 2**20)])
def test_peer_buckets_on_two_gpus_equal_nccl_bit_for_bit(bucket_mb, share_bytes):
    """Peer memory and copy engines against NCCL: one bucket, or a bucket per parameter (some
    smaller than two elements); each averaged in shares (share_bytes 0) or whole."""
    on_ranks(2, _peer_equals_nccl, bucket_mb, share_bytes, device="cuda")


def _peer_is_the_rank_order_mean(dp, share_bytes, steps=3, batch=12):
    """Beyond two ranks: peer buckets give every element the sum of the ranks' gradients in rank
    order times 1 / ranks (mean_rows' twin over the gathered gradients) bit for bit; NCCL, which
    sums in its own order, agrees to a few float32 ulps of the largest term."""
    from spikefuse.ops.mean_rows import mean_rows_reference
    from spikefuse.parallel import grad_peer

    grad_peer.SHARE_BYTES = share_bytes
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(0)
    local = WithSpare().to(dp.device)  # no reducer: this rank's own gradients
    models = [copy.deepcopy(local), copy.deepcopy(local)]
    reducers = [dp.reducer(m, bucket_mb=1e-4, transport=t) for m, t in zip(models, ("peer", "nccl"))]
    g = torch.Generator().manual_seed(1)
    mine = slice(dp.rank * batch // dp.world_size, (dp.rank + 1) * batch // dp.world_size)
    for step in range(steps):
        images = (torch.randn(batch, 2, 4, 4, generator=g) * 1.5 + 0.3).to(dp.device)
        labels = torch.randint(0, 3, (batch,), generator=g).to(dp.device)
        for model, reducer in zip([local, *models], [None, *reducers]):
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images[mine]), labels[mine]).backward()
            if reducer is not None:
                reducer.finish()
        means = []
        for (name, p), peer, nccl in zip(local.named_parameters(), *(m.parameters() for m in models)):
            if p.grad is None:  # no rank's: the reducers leave it None or zero
                assert all(q.grad is None or not q.grad.any() for q in (peer, nccl)), name
                means.append(None)
                continue
            rows = [torch.empty_like(p.grad) for _ in range(dp.world_size)]
            dist.all_gather(rows, p.grad.contiguous())
            rows = torch.stack(rows)
            means.append(mean_rows_reference(rows.reshape(dp.world_size, -1)).view_as(p.grad))
            if step:  # (the first step, which cuts the buckets, is torch.distributed's)
                torch.testing.assert_close(peer.grad, means[-1], rtol=0, atol=0,
                                           msg=lambda m: f"step {step}, {name}: {m}")
            ulps = 4 * dp.world_size * torch.finfo(torch.float32).eps * rows.abs().max().item()
            torch.testing.assert_close(nccl.grad, means[-1], rtol=0, atol=ulps, msg=lambda m: f"NCCL, {name}: {m}")
        with torch.no_grad():  # every model takes the same step
            for mean, *ps in zip(means, local.parameters(), *(m.parameters() for m in models)):
                for q in ps if mean is not None else ():
                    q -= 0.5 * mean


def _gpus_for(world: int):
    return pytest.mark.skipif(torch.cuda.device_count() < world, reason=f"needs {world} GPUs")


@pytest.mark.gpu
@pytest.mark.multi_gpu
@_gpus_for(3)
@pytest.mark.parametrize("share_bytes", [0, 2**20])
def test_peer_buckets_beyond_two_gpus_are_the_rank_order_mean(share_bytes):
    on_ranks(min(torch.cuda.device_count(), 4), _peer_is_the_rank_order_mean, share_bytes, device="cuda")


def _stepped_in_buckets(dp, make_optimizer, monkeypatch_capturing):
    """A reducer holding the optimizer steps each bucket's parameters as its mean is ready (as
    in a captured step: grad_reduce.capturing_on is made to say so); the weights
    are those of stepping every parameter after finish(), bit for bit. A parameter of the
    optimizer that is not the model's is stepped too."""
    torch.manual_seed(0)
    models = [WithSpare(), None]
    if make_optimizer is _lazy_adam:  # it needs contiguous parameters
        models[0].net.conv2.to(memory_format=torch.contiguous_format)
    models[1] = copy.deepcopy(models[0])
    extra = [nn.Parameter(torch.ones(3)) for _ in models]
    optimizers = [make_optimizer(list(m.parameters()) + [e]) for m, e in zip(models, extra)]
    reducers = [dp.reducer(models[0], bucket_mb=1e-4),  # a bucket per parameter, or nearly
                dp.reducer(models[1], bucket_mb=1e-4, optimizer=optimizers[1])]
    g = torch.Generator().manual_seed(1 + dp.rank)
    for step in range(3):
        images, labels = torch.randn(3, 2, 4, 4, generator=g), torch.randint(0, 3, (3,), generator=g)
        for model, reducer, optimizer, e in zip(models, reducers, optimizers, extra):
            optimizer.zero_grad(set_to_none=True)
            e.grad = torch.full_like(e, 0.5)
            with monkeypatch_capturing(step > 0):  # the first step, which learns the cut, is eager
                nn.functional.cross_entropy(model(images), labels).backward()
                reducer.finish()
            if reducer.optimizer is None:
                optimizer.step()
            assert reducer.stepped_in_buckets == (reducer.optimizer is not None and step > 0)
        for (name, p), q in zip(models[1].named_parameters(), models[0].parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=lambda m: f"step {step}, {name}: {m}")
        torch.testing.assert_close(extra[1], extra[0], rtol=0, atol=0)
    assert extra[1].ne(1).all()


def _capturing_switch():
    """A context in which the reducer sees its steps as captured into a CUDA graph, or not."""
    import contextlib

    from spikefuse.parallel import grad_reduce

    @contextlib.contextmanager
    def capturing(on: bool):
        real = grad_reduce.capturing_on
        grad_reduce.capturing_on = lambda device: on
        try:
            yield
        finally:
            grad_reduce.capturing_on = real
    return capturing


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def _lazy_adam(params):
    from spikefuse.optim import LazyAdam
    return LazyAdam(params, lr=0.01)


def _stepped_in_buckets_on_ranks(dp, make_optimizer):
    _stepped_in_buckets(dp, make_optimizer, _capturing_switch())


@pytest.mark.parametrize("make_optimizer", [_sgd, _adam, _lazy_adam], ids=["sgd", "adam", "lazy-adam"])
def test_the_optimizer_stepped_bucket_by_bucket_equals_one_step(make_optimizer):
    on_ranks(2, _stepped_in_buckets_on_ranks, make_optimizer)


class _GlobalNormSGD(torch.optim.SGD):
    """Stands for an optimizer whose update could read every gradient."""


def _unknown_optimizer_refused(dp):
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="optimizer: _GlobalNormSGD may update a parameter from more than"):
        dp.reducer(model, optimizer=_GlobalNormSGD(model.parameters(), lr=0.1))


def test_an_optimizer_that_may_read_other_gradients_is_refused_by_name():
    on_ranks(2, _unknown_optimizer_refused)


def _peer_refused_on_gloo(dp):
    with pytest.raises(RuntimeError, match="transport='peer'\\): it takes CUDA tensors"):
        dp.reducer(nn.Linear(2, 2), transport="peer")
    with pytest.raises(ValueError, match="transport: expected one of auto, nccl, peer, got 'nvlink'"):
        dp.reducer(nn.Linear(2, 2), transport="nvlink")


def test_a_transport_that_cannot_serve_is_refused_by_name():
    on_ranks(2, _peer_refused_on_gloo)


def test_auto_leaves_buckets_to_nccl_where_peer_buffers_would_crowd_the_gpu():
    """Peer buckets hold (ranks + 1) copies of the gradients: "auto" takes them while those fit
    in 1/16 of the GPU's memory (CIFAR-medium on 2 GPUs: 156 MiB of 80 GiB), else says why not."""
    from spikefuse.parallel.grad_peer import buffer_bytes
    from spikefuse.parallel.grad_reduce import too_large_for_peer

    gpu = 80 * 2**30
    assert buffer_bytes(13_646_986, 2) == 3 * 13_646_986 * 4
    assert too_large_for_peer(buffer_bytes(13_646_986, 2), gpu) == ""
    why = too_large_for_peer(buffer_bytes(500_000_000, 8), gpu)  # a 0.5 B-parameter model on 8 GPUs
    assert "16.8 GiB" in why and "1/16 of the GPU's 80 GiB" in why, why


def _buffers_follow_rank_0(dp):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    reducer = dp.reducer(model)
    model(torch.randn(5, 3) + dp.rank)  # every rank's running statistics move differently
    reducer.sync_buffers()
    mean = model[1].running_mean.clone()
    dist.broadcast(mean, 0)
    torch.testing.assert_close(model[1].running_mean, mean, rtol=0, atol=0)


def test_unsynchronised_buffers_follow_rank_0():
    on_ranks(2, _buffers_follow_rank_0)


def _second_backward_refused(dp):
    model = nn.Linear(3, 2)
    reducer = dp.reducer(model)
    loss = model(torch.randn(4, 3)).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="call finish\\(\\) after every backward"):
        loss.backward()
    reducer.remove()


def test_a_second_backward_before_finish_is_refused():
    on_ranks(2, _second_backward_refused)


def test_bad_bucket_size_and_no_process_group_are_refused_by_name():
    with pytest.raises(RuntimeError, match="needs an initialised process group"):
        GradientReducer(nn.Linear(2, 2))


def _bucket_size_refused(dp):
    with pytest.raises(ValueError, match="bucket_mb: expected a size in MB > 0, got 0"):
        dp.reducer(nn.Linear(2, 2), bucket_mb=0)


def test_a_bucket_size_of_zero_is_refused():
    on_ranks(2, _bucket_size_refused)


def _captured_equals_eager(dp, transport, holds_optimizer=False):
    """A CUDA graph of forward, backward and the reducer replays what the eager step computes;
    with the reducer holding the optimizer, the graph steps it bucket by bucket and the eager
    step once after the last bucket."""
    from spikefuse.capture import CapturedStep, prepare_optimizer

    torch.backends.cudnn.deterministic = True  # the two models' own gradients bit for bit alike

    torch.manual_seed(0)
    base = Net("fused")
    models = [convert_sync_batchnorm(copy.deepcopy(base).to(dp.device), dp.sync_bn_group) for _ in range(2)]
    g = torch.Generator().manual_seed(2 + dp.rank)
    batches = [(torch.randn(3, 2, 4, 4, generator=g).to(dp.device),
                torch.randint(0, 3, (3,), generator=g).to(dp.device)) for _ in range(2)]
    results = []
    for model, captured in zip(models, (False, True)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        prepare_optimizer(optimizer)  # the fused update, eager and captured
        reducer = dp.reducer(model, bucket_mb=1e-4, transport=transport,  # several buckets in flight
                             optimizer=optimizer if holds_optimizer else None)

        def step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            reducer.finish()
            if not holds_optimizer:
                optimizer.step()
            return loss
        run = (CapturedStep(step, stream=torch.cuda.Stream(dp.device), agree_across=dist.group.WORLD)
               if captured else step)
        for i in range(8):
            loss = run(*batches[i % 2])
        assert not captured or run.captured > 0, "the step was not captured"
        assert reducer.transport_in_use == (transport if transport != "auto" else "peer")
        assert reducer.stepped_in_buckets == (holds_optimizer and captured)
        results.append([loss.detach().clone()] + [p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("transport, world, holds_optimizer",
                         [("nccl", 2, False), ("peer", 2, False), ("auto", 2, False), ("nccl", 2, True),
                          ("auto", 2, True), pytest.param("peer", 4, True, marks=_gpus_for(4))])
def test_captured_reducer_equals_eager(transport, world, holds_optimizer):
    on_ranks(world, _captured_equals_eager, transport, holds_optimizer, device="cuda")


def _trainer_matches_one_process(dp, clip):
    """Trainer under data parallel (reducer, SyncBN, LazyAdam, with or without gradient
    clipping) trains the weights one process trains on the combined batches. Without
    clipping the reducer holds the optimizer (it steps it in finish())."""
    from types import SimpleNamespace

    from spikefuse.data.dataset import DenseSpikeDataset
    from spikefuse.nn import LIF, TemporalBatchNorm1d
    from spikefuse.optim import LazyAdam
    from spikefuse.train.loop import Trainer
    from test_ddp import MeanOverTime

    g = torch.Generator().manual_seed(4)
    rates = torch.rand(24, 6, generator=g)  # 24 samples, batches of 8: no padded slice
    spikes = (torch.rand(3, 24, 6, generator=g) < rates).float()
    data = DenseSpikeDataset(spikes, rates.view(24, 3, 2).sum(2).argmax(1))
    splits = SimpleNamespace(train=data, test=data)

    def trained(parallel):
        torch.manual_seed(0)
        # no bias before BN: its gradient is rounding noise, which Adam would scale up to whole steps
        model = nn.Sequential(nn.Linear(6, 8, bias=False), TemporalBatchNorm1d(8), LIF(), nn.Linear(8, 3),
                              MeanOverTime())
        if parallel is not None:
            model = convert_sync_batchnorm(model, parallel.sync_bn_group)
        optimizer = LazyAdam(model.parameters(), lr=0.05)
        trainer = Trainer(model, splits, optimizer, epochs=2, batch_size=8, clip_grad_norm=clip, seed=3,
                          progress=False, data_parallel=parallel)
        if parallel is not None:
            assert trainer.reducer.optimizer is (None if clip else optimizer)
        trainer.fit()
        return model.state_dict()

    ranks, single = trained(dp), trained(None)
    for name, value in single.items():
        close(ranks[name].double(), value.double(), name)


@pytest.mark.parametrize("clip", [0.05, None])
def test_trainer_on_two_ranks_trains_what_one_process_trains(clip):
    on_ranks(2, _trainer_matches_one_process, clip)
