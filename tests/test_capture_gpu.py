"""Captured training steps on a GPU: the same losses, parameters, BN statistics and spike
counts as eager steps, over 20 steps of every model in spikefuse.models (bit-equal where
two eager runs are; else within their spread); a second graph for the last, shorter batch;
the fallback on a step that syncs; the trainer's checkpoints resuming bit for bit."""
import copy
import os
import warnings

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import pytest
import torch
from torch import nn

from spikefuse.models import MODELS, build_model
from spikefuse.capture import CaptureFallback, CapturedStep, prepare_optimizer
from spikefuse.train.spikes import SpikeMonitor

pytestmark = pytest.mark.gpu  # CUDA graphs

STEPS = 20
IMAGE_MODELS = {"cifar-small", "cifar-medium", "cifar-large", "resnet18", "resnet34"}


@pytest.fixture(autouse=True)
def deterministic():
    torch.use_deterministic_algorithms(True, warn_only=True)  # max-pool backward has no deterministic kernel
    yield
    torch.use_deterministic_algorithms(False)


def model_and_batches(name, batch=4):
    """A narrow version of the model, and two batches of its input (images or frames)."""
    torch.manual_seed(0)
    if name in IMAGE_MODELS:
        shape, T, classes = (3, 32, 32), 2, 10
    elif name == "dvs-gesture":
        shape, T, classes = (2, 32, 32), 3, 11
    elif name.startswith("ipu-"):
        from spikefuse.models import ipu
        net = ipu.NETWORKS[name.removesuffix("-recurrent")]
        shape, T, classes = net.input_shape, 5, net.num_classes
    elif name == "shd":
        shape, T, classes = (700,), 5, 20
    else:
        shape, T, classes = (64,), 5, 10
    kwargs = {} if name == "mlp" else {"width": 0.125}
    model = build_model(name, shape, classes, T, **kwargs).cuda()
    batches = []
    for _ in range(2):
        x = (torch.randn(batch, *shape) if name in IMAGE_MODELS else
             (torch.rand(T, batch, *shape) < 0.2).float()).cuda()
        batches.append((x, torch.randint(0, classes, (batch,)).cuda()))
    return model, batches


def train(model, batches, capture, steps=STEPS, sync_op=False):
    """Losses of `steps` Adam steps (lr as a tensor, capturable), the final parameters and
    buffers, and the spike counts."""
    model = copy.deepcopy(model)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert prepare_optimizer(optimizer) is None
    losses = torch.zeros(steps, device="cuda")

    def step(x, y, i):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if sync_op:
            loss.item()  # a host sync: cannot be captured
        losses.index_copy_(0, i, loss.detach().reshape(1))
    run = CapturedStep(step) if capture else step
    with SpikeMonitor(model) as monitor:
        for k in range(steps):
            x, y = batches[k % len(batches)]
            run(x, y, torch.tensor([k], device="cuda"))
    torch.cuda.synchronize()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses.cpu(), state, monitor.counts.cpu(), run


def max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() if x.numel() else 0.0
               for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_captured_steps_match_eager(name):
    model, batches = model_and_batches(name)
    eager1 = train(model, batches, capture=False)
    eager2 = train(model, batches, capture=False)
    captured = train(model, batches, capture=True)
    run = captured[3]
    assert run.captured == 1 and run.fallback_reason is None and run.pool_bytes > 0
    assert torch.isfinite(captured[0]).all()
    e1 = [eager1[0], *eager1[1].values(), eager1[2]]
    e2 = [eager2[0], *eager2[1].values(), eager2[2]]
    cap = [captured[0], *captured[1].values(), captured[2]]
    spread = max_diff(e1, e2)
    print(f"\n{name}: eager vs eager max difference {spread:.3g}, captured vs eager {max_diff(e1, cap):.3g}")
    if spread == 0.0:
        for a, b in zip(e1, cap):
            assert torch.equal(a, b), name  # bit for bit: losses, parameters, BN buffers, spike counts
    else:
        assert max_diff(e1, cap) <= 2 * spread, (name, spread)


def test_the_last_shorter_batch_gets_its_own_graph():
    model, full = model_and_batches("mlp", batch=8)
    short = [(x[:, :3].contiguous(), y[:3].contiguous()) for x, y in full]
    batches = [full[0], short[0], full[1], short[1]] * 3  # epochs of two full batches and a short one
    eager = train(model, batches, capture=False, steps=len(batches) * 2)
    captured = train(model, batches, capture=True, steps=len(batches) * 2)
    assert captured[3].captured == 2
    assert torch.equal(eager[0], captured[0])
    for a, b in zip(eager[1].values(), captured[1].values()):
        assert torch.equal(a, b)


def test_a_step_that_syncs_falls_back_once_and_trains_like_eager():
    model, batches = model_and_batches("mlp")
    eager = train(model, batches, capture=False, sync_op=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        captured = train(model, batches, capture=True, sync_op=True)
    messages = [str(w.message) for w in record if issubclass(w.category, CaptureFallback)]
    assert len(messages) == 1 and "capturing failed" in messages[0]
    assert torch.equal(eager[0], captured[0])
    for a, b in zip(eager[1].values(), captured[1].values()):
        assert torch.equal(a, b)


def test_failed_capture_leaves_random_draws_working_and_unchanged():
    """A step that draws random numbers (dropout) and syncs: its capture fails, and the eager
    fallback, and every draw after it, run and draw what plain eager steps draw."""
    x = torch.ones(64, device="cuda")

    def step(x):
        y = nn.functional.dropout(x, 0.5)
        y.sum().item()  # a host sync: cannot be captured
        return y
    runs = []
    for run in (CapturedStep(step), step):
        torch.cuda.manual_seed(7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallback)
            outs = [run(x) for _ in range(6)]
        runs.append(torch.stack(outs + [torch.rand(64, device="cuda")]))
    assert torch.equal(runs[0], runs[1])


def test_prepared_adam_takes_the_fused_kernel_unless_told_otherwise():
    # drawn on the CPU: a capture that failed in an earlier test of this process can leave the
    # CUDA generator refusing eager draws ("offset increment outside graph capture")
    g = torch.Generator().manual_seed(0)
    shapes = [(33, 17), (17,), (5, 3, 3)]
    grads = [[torch.randn(shape, generator=g).cuda() for shape in shapes] for _ in range(3)]
    start = [torch.randn(shape, generator=g).cuda() for shape in shapes]
    chosen = {"unset": {}, "foreach": {"foreach": True}, "not fused": {"fused": False}}
    runs = {}
    for name, kwargs in chosen.items():
        params = [nn.Parameter(p.clone()) for p in start]
        optimizer = torch.optim.Adam(params, lr=1e-2, **kwargs)
        assert prepare_optimizer(optimizer) is None
        assert optimizer.param_groups[0]["fused"] is (True if name == "unset" else kwargs.get("fused"))
        for step_grads in grads:  # the same gradients: the updates alone are compared
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            optimizer.step()
        runs[name] = [p.detach() for p in params]
    for fused, foreach in zip(runs["unset"], runs["foreach"]):  # the same update, rounded otherwise
        torch.testing.assert_close(fused, foreach, rtol=1e-5, atol=1e-6)


def test_trainer_captures_by_default_and_resumes_bit_for_bit(tmp_path):
    from spikefuse.data import load
    from spikefuse.train.loop import Trainer

    def trainer(run_dir, epochs, capture=None):
        torch.manual_seed(0)
        splits = load("digits", time_steps=8, device="cuda")
        model = build_model("mlp", splits.input_shape, splits.num_classes, hidden=(64, 64)).cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        if capture is False:  # the same arithmetic as the captured steps
            assert prepare_optimizer(optimizer) is None
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
        return Trainer(model, splits, optimizer, epochs=epochs, batch_size=64, scheduler=scheduler,
                       device="cuda", capture=capture, run_dir=run_dir, progress=False)

    def losses(t):  # the evaluation's too: it replays a graph of its own (Trainer.eval_step)
        return [h[key] for key in ("train_loss", "train_rate", "test_loss", "test_acc", "test_rate") for h in t.history]

    def check(reference, other, spread, what):
        diff = max(abs(a - b) for a, b in zip(losses(reference), losses(other)))
        print(f"\n{what}: max difference {diff:.3g} (eager vs eager: {spread:.3g})")
        assert diff == 0.0 if spread == 0.0 else diff <= 2 * spread, what

    straight = trainer(tmp_path / "a", 4)
    straight.fit()
    assert straight.step.enabled and straight.step.captured == 2  # full batches, and the last one
    assert straight.eval_step.captured >= 1 and straight.eval_step.fallback_reason is None
    eager1, eager2 = trainer(tmp_path / "e1", 4, capture=False), trainer(tmp_path / "e2", 4, capture=False)
    eager1.fit()
    eager2.fit()
    spread = max(abs(a - b) for a, b in zip(losses(eager1), losses(eager2)))
    check(eager1, straight, spread, "captured trainer vs eager")
    first = trainer(tmp_path / "b", 2)
    first.fit()
    resumed = trainer(tmp_path / "b", 4)
    resumed.resume()
    resumed.fit()
    check(straight, resumed, spread, "resumed after epoch 2 vs straight, both captured")
    if spread == 0.0:
        for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
            assert torch.equal(a, b)
