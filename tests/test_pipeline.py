"""The temporal pipeline (spikefuse.parallel.pipeline) against single-process training.

Each world size (2 and 3 gloo processes) runs every case in one launch; the parent
process computes the single-device loss and gradients and compares: loss and every
parameter gradient within 1e-6 relative (1e-7 absolute), spikes exactly.
"""
import datetime
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse.models import build_model
from spikefuse.nn.spiking_layers import SpikingLinear
from spikefuse.parallel.pipeline import (PipelinePeerError, PipelineTrainer, _Incoming, check_layers, chunked_step,
                                         pipeline_step, split_stages)
from helpers import worker_start_method

T, B, IN, CLASSES = 7, 2, 5, 3
RTOL, ATOL = 1e-6, 1e-7


# ---- networks and losses ----

def deep_lif(reset="hard", backend="reference"):
    """deep-lif, narrow: Flatten, Linear, LIF, (SpikingLinear, LIF) x 2, SpikingLinear."""
    return build_model("deep-lif", (IN,), CLASSES, T, depth=3, hidden=8, reset=reset, backend=backend).layers


def spiking_readout(reset="hard", backend="reference"):
    """Ends in neurons, so the last stage's outputs are spikes; PLIF's decay gets a gradient."""
    return nn.Sequential(
        nn.Linear(IN, 8), snn.PLIF(channels=8, threshold=0.5, reset=reset, backend=backend),
        SpikingLinear(8, 8), snn.IF(threshold=0.7, reset=reset, backend=backend),
        nn.Linear(8, CLASSES), snn.LIF(decay=0.8, threshold=0.3, reset=reset, backend=backend))


def with_batch_norm():
    return nn.Sequential(nn.Linear(IN, 8), snn.TemporalBatchNorm1d(8), snn.LIF(threshold=0.5, backend="reference"),
                         nn.Linear(8, 8), snn.LIF(threshold=0.5, backend="reference"), nn.Linear(8, CLASSES))


NETWORKS = {"deep-lif": deep_lif, "spiking-readout": spiking_readout, "batch-norm": with_batch_norm}


def rate_cross_entropy(out, y):
    return nn.functional.cross_entropy(out.mean(0), y)


def rate_mse(out, y):
    return nn.functional.mse_loss(out.mean(0), nn.functional.one_hot(y, CLASSES).float())


@dataclass(frozen=True)
class Case:
    net: str
    chunks: int
    reset: str = "hard"
    backend: str = "reference"
    options: dict = field(default_factory=dict)

    def build(self):
        torch.manual_seed(0)
        kwargs = {} if self.net == "batch-norm" else dict(reset=self.reset, backend=self.backend)
        return NETWORKS[self.net](**kwargs)

    def loss_fn(self):
        return rate_mse if self.net == "spiking-readout" else rate_cross_entropy


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(T, B, IN, generator=g) < 0.5).float() * 1.5
    return x, torch.randint(0, CLASSES, (B,), generator=g)


CASES = {
    "hard C=1": Case("deep-lif", 1),
    "hard C=2": Case("deep-lif", 2),
    "hard C=3 (7 steps: uneven chunks)": Case("deep-lif", 3),
    "hard C=T": Case("deep-lif", T),
    "soft C=3": Case("deep-lif", 3, reset="soft"),
    "soft C=4, floats handed over": Case("deep-lif", 4, reset="soft", options=dict(pack_spikes=False)),
    "spiking readout, hard C=3": Case("spiking-readout", 3),
    "spiking readout, soft C=5": Case("spiking-readout", 5, reset="soft"),
    "fused kernels, spiking readout, hard C=2": Case("spiking-readout", 2, backend="fused"),
    "hard C=4, weight gradients in step (lag 0)": Case("deep-lif", 4, options=dict(weight_grad_lag=0)),
    "hard C=4, all weight gradients held to the end": Case("deep-lif", 4, options=dict(weight_grad_lag=9)),
}
BN_CASE = Case("batch-norm", 3, options=dict(batch_norm="per_chunk"))


# ---- the single-process oracles ----

def single_device(case):
    """Loss, outputs and gradients of ordinary (unpipelined) training."""
    layers = case.build()
    x, y = data()
    out = layers(x)
    loss = case.loss_fn()(out, y)
    loss.backward()
    return loss.detach(), out.detach(), {n: p.grad.clone() for n, p in layers.named_parameters()}


def chunked_single_device(case):
    """Batch norm per chunk, by hand: chunk after chunk through all layers, neuron states
    carried (not detached), one graph over the whole sequence."""
    layers = case.build()
    x, y = data()
    states, outs = {}, []
    for x_c in x.tensor_split(case.chunks):
        for i, layer in enumerate(layers):
            if isinstance(layer, snn.LIF):
                x_c, states[i] = F.lif(x_c, decay=layer.decay, threshold=layer.threshold, v0=states.get(i),
                                       return_state=True, backend="reference")
            else:
                x_c = layer(x_c)
        outs.append(x_c)
    out = torch.cat(outs)
    loss = case.loss_fn()(out, y)
    loss.backward()
    return loss.detach(), out.detach(), {n: p.grad.clone() for n, p in layers.named_parameters()}


# ---- running ranks ----

def launch(world, worker, *args):
    """Run worker(rank, world, *args) in `world` gloo processes; returns {rank: its result}
    for the ranks that returned one (a rank that exits on purpose returns none)."""
    with tempfile.TemporaryDirectory() as out_dir:
        # forked where a fork can run them (no re-import of torch: seconds saved); the fused case needs the interpreter
        with worker_start_method(interpreter=True) as start_method:
            ctx = mp.get_context(start_method)
            procs = [ctx.Process(target=_entry, args=(rank, world, out_dir, worker, args))
                     for rank in range(world)]
            for p in procs:
                p.start()
        try:
            for rank, p in enumerate(procs):
                p.join(timeout=240)
                error = os.path.join(out_dir, f"{rank}.err")
                assert p.exitcode == 0, f"rank {rank} exited with {p.exitcode}:\n" + (
                    open(error).read() if os.path.exists(error) else "(no traceback: killed or timed out)")
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
        files = {rank: os.path.join(out_dir, f"{rank}.pt") for rank in range(world)}
        return {rank: torch.load(f, weights_only=False) for rank, f in files.items() if os.path.exists(f)}


def _entry(rank, world, out_dir, worker, args):
    torch.set_num_threads(1)
    try:
        # a file rendezvous: no port to race for with the other tests running beside this one
        dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))  # a loaded machine's interpreter is slow
        result = worker(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    os._exit(0)  # no teardown: after a dead peer, destroying the group could wait on it


def run_cases(rank, world, cases):
    """Each case: the pipelined step's loss, outputs (last stage) and own parameters' gradients."""
    results = {}
    for name, case in cases.items():
        layers = case.build()
        trainer = PipelineTrainer(layers, case.loss_fn(), case.chunks, timeout=20, **case.options)
        x, y = data()
        loss = trainer.step(x if trainer.stage_index == 0 else None, y if trainer.is_last else None)
        grads = {n: p.grad.clone() for n, p in trainer.named_parameters()}
        results[name] = (loss, trainer.outputs, grads, [list(r) for r in trainer.cut])
    case = CASES["hard C=3 (7 steps: uneven chunks)"]  # two steps with an optimizer, as a captured step
    trainer = PipelineTrainer(case.build(), case.loss_fn(), case.chunks, timeout=20)
    step = trainer.captured(torch.optim.SGD(trainer.parameters(), lr=0.5))
    x, y = data()
    losses = [step(x if trainer.stage_index == 0 else T, y if trainer.is_last else None) for _ in range(2)]
    results["captured"] = (losses, {n: p.detach().clone() for n, p in trainer.named_parameters()},
                           {n: p.grad.clone() for n, p in trainer.named_parameters()})
    case = CASES["spiking readout, hard C=3"]  # under an initialized group, chunked_step stays on this rank
    layers = case.build()
    loss, out = chunked_step(layers, *data(), case.loss_fn(), case.chunks, return_outputs=True)
    results["chunked_step"] = ([loss], out, {n: p.grad for n, p in layers.named_parameters()}, None)
    try:  # every rank asks for one stage too many
        PipelineTrainer(deep_lif(), rate_cross_entropy, 2, stages=world + 1)
    except ValueError as e:
        results["stages mismatch"] = str(e)
    try:  # one layer fewer than ranks
        PipelineTrainer(deep_lif()[:world - 1], rate_cross_entropy, 2)
    except ValueError as e:
        results["too few layers"] = str(e)
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def pipelined(request):
    world = request.param
    cases = {**CASES, "batch norm per chunk": BN_CASE}
    return world, launch(world, run_cases, cases)


def gathered(ranks, name):
    """(loss per rank, last stage's outputs, all gradients by name, cut) of a case."""
    grads = {}
    for loss, _, own, cut in (ranks[r][name] for r in ranks):
        grads.update(own)
    last = ranks[max(ranks)][name]
    return [ranks[r][name][0] for r in ranks], last[1], grads, last[3]


def assert_matches(got, want, spikes):
    losses, out, grads, cut = got
    loss_ref, out_ref, grads_ref = want
    for loss in losses:  # every rank has the loss
        torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    if spikes:
        assert torch.equal(out, out_ref)
        assert 0 < out.mean() < 1  # the comparison means something: neither silent nor saturated
    else:
        torch.testing.assert_close(out, out_ref, rtol=RTOL, atol=ATOL)
    assert grads.keys() == grads_ref.keys()
    for n, g in grads.items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(g, grads_ref[n], rtol=RTOL, atol=ATOL, msg=n)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.interpreter) if case.backend == "fused"
                                  else name for name, case in CASES.items()])  # interpreter: the oracle runs fused here
def test_pipeline_equals_single_device(pipelined, name):
    world, ranks = pipelined
    got = gathered(ranks, name)
    assert len(got[3]) == world
    assert_matches(got, single_device(CASES[name]), spikes=CASES[name].net == "spiking-readout")


def test_holding_weight_gradients_back_changes_no_bit(pipelined):
    """The lag only moves when each chunk's weight gradients run; they are added in the same
    order, so the gradients are the same bits (the default lag, 2k + 1, is in the cases above)."""
    _, ranks = pipelined
    in_step = gathered(ranks, "hard C=4, weight gradients in step (lag 0)")
    held = gathered(ranks, "hard C=4, all weight gradients held to the end")
    assert torch.equal(in_step[0][0], held[0][0])
    for n, g in in_step[2].items():
        assert torch.equal(g, held[2][n]), n


def test_batch_norm_per_chunk_is_chunked_statistics(pipelined):
    _, ranks = pipelined
    got = gathered(ranks, "batch norm per chunk")
    assert_matches(got, chunked_single_device(BN_CASE), spikes=False)
    whole_t = single_device(BN_CASE)  # a different model, as documented: not silently the same
    assert not torch.allclose(got[0][0], whole_t[0], rtol=1e-4)


def test_chunked_step_ignores_the_group(pipelined):
    _, ranks = pipelined
    for r in ranks:
        assert_matches(ranks[r]["chunked_step"], single_device(CASES["spiking readout, hard C=3"]), spikes=True)


def test_captured_step_with_an_optimizer_equals_single_device_training(pipelined):
    """PipelineTrainer.captured (eager on the CPU): two SGD steps, as one process trains."""
    _, ranks = pipelined
    case = CASES["hard C=3 (7 steps: uneven chunks)"]
    layers = case.build()
    optimizer = torch.optim.SGD(layers.parameters(), lr=0.5)
    x, y = data()
    losses = []
    for _ in range(2):
        optimizer.zero_grad()
        losses.append(case.loss_fn()(layers(x), y))
        losses[-1].backward()
        optimizer.step()
    params, grads = {}, {}
    for r in ranks:
        for loss, want in zip(ranks[r]["captured"][0], losses):
            torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
        params.update(ranks[r]["captured"][1])
        grads.update(ranks[r]["captured"][2])
    assert params.keys() == dict(layers.named_parameters()).keys()
    for n, p in layers.named_parameters():
        torch.testing.assert_close(params[n], p.detach(), rtol=RTOL, atol=ATOL, msg=n)
        torch.testing.assert_close(grads[n], p.grad, rtol=RTOL, atol=ATOL, msg=n)
    assert not torch.equal(losses[0], losses[1])  # the optimizer did step


def test_world_size_mismatch_and_too_few_layers_are_named(pipelined):
    world, ranks = pipelined
    for r in ranks:
        assert ranks[r]["stages mismatch"].startswith(f"stages: {world + 1} stages asked for, but the process "
                                                      f"group has {world} ranks")
        assert ranks[r]["too few layers"].startswith(f"stages: cannot cut {world - 1} layers into {world} stages")


# ---- a rank that dies or stalls ----

def lose_a_rank(rank, world, victim, how, timeout):
    """`victim` exits before the trainer is made, or exits or stalls after one step; the
    others go on. Returns (the error they got, seconds from where they were stuck)."""
    if rank == victim and how == "exits at start":
        os._exit(0)
    start = time.monotonic()
    try:
        trainer = PipelineTrainer(deep_lif(), rate_cross_entropy, 3, timeout=timeout)
        x, y = data()
        trainer.step(x, y)
        if rank == victim:
            time.sleep(timeout + 1 if how == "stalls" else 0)  # the others give up at `timeout`
            os._exit(0)
        start = time.monotonic()
        trainer.step(x, y)
        return "no error", time.monotonic() - start
    except PipelinePeerError as e:
        return str(e), time.monotonic() - start


@pytest.mark.parametrize("how", ["exits", "stalls", "exits at start"])
def test_a_lost_rank_makes_the_others_fail_within_the_timeout(how):
    world, victim, timeout = 3, 1, 2.0
    results = launch(world, lose_a_rank, victim, how, timeout)
    assert sorted(results) == [0, 2]
    for rank, (message, seconds) in results.items():
        print(f"rank {rank} after {seconds:.2f} s: {message}")
        assert seconds < timeout + 3, (rank, seconds)
        if how == "exits at start":  # the monitored barrier when the trainer is made
            assert "not every stage came up" in message, message
        else:
            assert "rank 1 (stage 1)" in message and "died or stalled" in message, message
    if how == "exits at start":
        # rank 0 names the missing rank, or, where it saw rank 1's connection close before the
        # barrier's timeout (spawned ranks on a GPU machine), says so
        assert ("Ranks 1 failed to pass monitoredBarrier" in results[0][0]
                or "Connection closed by peer" in results[0][0]), results[0][0]


# ---- single process: chunked BPTT, the cut, named errors ----

def test_one_stage_chunked_equals_unchunked():
    case = Case("spiking-readout", 4, reset="hard")
    layers = case.build()
    x, y = data()
    loss, out = pipeline_step(layers, x, y, rate_mse, 4, return_outputs=True)
    grads = {n: p.grad for n, p in layers.named_parameters()}
    assert_matches(([loss], out, grads, None), single_device(case), spikes=True)


def test_a_receive_is_waited_for_once():
    """A second wait on a gloo receive would wait for another message: result() keeps the first."""
    class Peers:
        waits = 0

        def wait(self, work, what, peer):
            self.waits += 1
    peers = Peers()
    incoming = _Incoming(peers, None, torch.ones(2), lambda b: b * 2, "receiving", 1)
    first = incoming.result()
    assert incoming.result() is first and peers.waits == 1 and torch.equal(first, torch.full((2,), 2.0))


def test_split_stages_balances_parameters_and_cuts_after_neurons():
    layers = deep_lif()  # Flatten, Linear 5x8, LIF, SL 8x8, LIF, SL 8x8, LIF, SL 8x3 (+3 bias)
    assert split_stages(layers, 1) == [range(0, 8)]
    assert split_stages(layers, 2) == [range(0, 5), range(5, 8)]  # 104 | 91: ends after a LIF
    assert split_stages(layers, 3) == [range(0, 3), range(3, 5), range(5, 8)]
    assert split_stages(layers, 8) == [range(i, i + 1) for i in range(8)]
    costs = [0, 1, 1, 1, 1, 1, 1, 1]
    assert split_stages(layers, 2, costs=costs) == [range(0, 5), range(5, 8)]  # 4 | 3 beats 3 | 4 only by neurons
    assert split_stages(layers, 2, costs=[0, 1, 1, 1, 1, 1, 1, 10]) == [range(0, 7), range(7, 8)]


def test_named_errors():
    layers = deep_lif()
    with pytest.raises(ValueError, match=r"^stages: cannot cut 8 layers into 9 stages"):
        split_stages(layers, 9)
    with pytest.raises(ValueError, match=r"^chunks: expected an integer >= 1, got 0"):
        PipelineTrainer(layers, rate_cross_entropy, 0)
    trainer = PipelineTrainer(layers, rate_cross_entropy, T + 1)
    with pytest.raises(ValueError, match=r"^chunks: 8 chunks of a sequence of T=7 steps"):
        trainer.step(*data())
    with pytest.raises(ValueError, match=r"^stages: 2 stages asked for, but the process group has 1 ranks"):
        PipelineTrainer(layers, rate_cross_entropy, 2, stages=2)
    with pytest.raises(ValueError, match=r"^cut: expected 1 consecutive non-empty ranges"):
        PipelineTrainer(layers, rate_cross_entropy, 2, cut=[range(0, 4)])
    with pytest.raises(ValueError, match=r"^x: the first stage needs the input"):
        trainer.step(None, data()[1])
    for lag in (-1, 1.0, True):
        with pytest.raises(ValueError, match=r"^weight_grad_lag: expected an integer >= 0 or None"):
            PipelineTrainer(layers, rate_cross_entropy, 2, weight_grad_lag=lag)


def test_batch_norm_is_refused_by_default():
    with pytest.raises(ValueError, match=r"^batch_norm: layer 1 \(TemporalBatchNorm1d\) normalizes over all T"):
        PipelineTrainer(with_batch_norm(), rate_cross_entropy, 2)
    with pytest.raises(ValueError, match=r"^batch_norm: layer 0 \(BNLIF\)"):
        check_layers([snn.BNLIF(4)], batch_norm="per_chunk")
    with pytest.raises(ValueError, match=r"^layers: layer 0 \(Sequential\) holds neurons"):
        check_layers([nn.Sequential(nn.Linear(2, 2), snn.LIF())])
    with pytest.raises(ValueError, match=r"^batch_norm: unknown policy 'whole'"):
        check_layers([nn.Linear(2, 2)], batch_norm="whole")


def test_a_cut_decided_over_the_sequence_is_refused():
    """grad_scope 'sequence'/'batch' looks at all T steps; a pipeline sees one chunk at a time."""
    for scope in ("sequence", "batch"):
        with pytest.raises(ValueError, match=rf"^grad_scope: layer 1 \(LIF\) decides its gradient cut"):
            check_layers([nn.Linear(4, 4), snn.LIF(grad_threshold=0.9, grad_scope=scope)])
    check_layers([nn.Linear(4, 4), snn.LIF(grad_threshold=0.9), snn.LIF(grad_scope="batch")])  # step, or no cut


@pytest.mark.parametrize("neuron", [snn.ALIF(), snn.CUBA(), snn.RecurrentLIF(4), snn.RecurrentALIF(4)],
                         ids=lambda m: type(m).__name__)
def test_neurons_whose_state_is_not_carried_are_refused(neuron):
    """Their state would restart at every chunk: a different model, never run silently."""
    with pytest.raises(ValueError, match=rf"^layers: layer 1 \({type(neuron).__name__}\) has state"):
        check_layers([nn.Linear(4, 4), neuron])


def test_deep_lif_is_registered_and_keeps_firing_through_its_depth():
    torch.manual_seed(0)
    model = build_model("deep-lif", (2048,), 10, None, backend="reference")
    lifs = [m for m in model.layers if isinstance(m, snn.LIF)]
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    assert len(lifs) == 8 and [m.out_features for m in linears] == [2048] * 8 + [10]
    rates = []
    for lif in lifs:
        lif.register_forward_hook(lambda m, i, out: rates.append(out.mean().item()))
    x = (torch.rand(8, 2, 2048) < 0.2).float()
    with torch.no_grad():
        assert model(x).shape == (2, 10)
    assert all(0.03 < r < 0.4 for r in rates), rates  # neither dying out nor saturating with depth


def test_chunked_step_keeps_the_secondary_gradient_threshold():
    """A LIF's grad_threshold survives the pipeline's own LIF calls: chunked gradients equal
    one-device gradients, and differ from those without the cut."""
    def build(cut):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(IN, 8), snn.LIF(threshold=0.5, grad_threshold=cut, backend="reference"),
                             nn.Linear(8, CLASSES))
    x, y = data()
    grads = {}
    for cut in (0.3, float("-inf")):
        layers = build(cut)
        pipeline_step(layers, x, y, rate_mse, 4)
        ref = build(cut)
        rate_mse(ref(x), y).backward()
        for (n, p), q in zip(layers.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=n)
        grads[cut] = layers[0].weight.grad
    assert not torch.allclose(grads[0.3], grads[float("-inf")])
