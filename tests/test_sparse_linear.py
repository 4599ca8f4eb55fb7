"""Sparse spike execution: index lists, the sparse backward of SparseSpikingLinear, LazyAdam
and dispatch, against dense float32 computations (Triton kernels through the interpreter)."""
import warnings

import pytest
import torch

from spikefuse.models.ipu import IPUNet
from spikefuse.nn import LIF
from spikefuse.nn.sparse_linear import SparseSpikingLinear, update_dispatch
from spikefuse.ops import grad_rows
from spikefuse.ops.lazy_adam import nonzero_rows
from spikefuse.ops.sparse_linear import carrying_columns, gather_carrying, sparse_spike_linear
from spikefuse.ops.spike_index import active_indices, active_indices_reference, line_flags
from spikefuse.ops.spike_linear import spike_linear
from spikefuse.optim import LazyAdam
from helpers import DEVICE


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("shape,capacity", [((7, 50), 6), ((1, 1), 1), ((3, 2100), 40), ((5, 33), 33), ((0, 9), 4)])
def test_active_indices_match_reference(shape, capacity):
    torch.manual_seed(0)
    x = (torch.rand(shape) < 0.2).float()
    idx, count = active_indices(x.to(DEVICE), capacity)
    ref_idx, ref_count = active_indices_reference(x, capacity)
    assert torch.equal(count.cpu(), ref_count) and torch.equal(idx.cpu(), ref_idx)


def test_active_indices_counts_overflow_and_reads_strided_rows():
    x = torch.zeros(4, 20)
    x[1, ::2] = 1  # 10 nonzeros, capacity 3: the list holds the first 3, the count says 10
    idx, count = active_indices(x.t().contiguous().t().to(DEVICE), 3)  # column-major input
    assert count.tolist() == [0, 10, 0, 0]
    assert idx[1].tolist() == [0, 2, 4]
    idx, count = active_indices(x.to(DEVICE)[::2], 3)  # rows 0 and 2: strided rows
    assert count.tolist() == [0, 0]


def test_active_indices_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rows, columns"):
        active_indices(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="capacity"):
        active_indices(torch.zeros(2, 3), 0)


def _sparse_gy(shape, out, share, seed):
    """A gradient whose columns are zero except a `share` of them (what a LIF with a
    secondary threshold sends back), with some zeros inside the carrying columns too."""
    g = torch.Generator().manual_seed(seed)
    cols = torch.rand(out, generator=g) < share
    gy = torch.randn(*shape, out, generator=g) * cols
    return gy * (torch.rand(gy.shape, generator=g) < 0.7)


@pytest.mark.parametrize("T,B,IN,OUT,share", [(5, 3, 37, 41, 0.2), (1, 1, 17, 70, 0.05), (3, 2, 130, 33, 1.0),
                                              (2, 5, 65, 129, 0.0), (4, 3, 136, 50, 0.3), (2, 2, 8, 9, 0.5)])
def test_sparse_backward_equals_dense(T, B, IN, OUT, share):
    """Spikes exactly, gradients to 1e-5 relative against the dense backward (TF32 off)."""
    torch.manual_seed(T * 100 + OUT)
    s = (torch.rand(T, B, IN) < 0.3).float().to(DEVICE).requires_grad_()
    w = torch.randn(OUT, IN, device=DEVICE, requires_grad=True)
    b = torch.randn(OUT, device=DEVICE, requires_grad=True)
    gy = _sparse_gy((T, B), OUT, share, seed=OUT).to(DEVICE)
    grads = []
    for op in (sparse_spike_linear, spike_linear):
        y = op(s, w, b)
        grads.append((y.detach(), *torch.autograd.grad(y, (s, w, b), gy)))
    (y_sparse, *sparse), (y_dense, *dense) = grads
    assert torch.equal(y_sparse, y_dense)
    for a, d in zip(sparse, dense):
        assert rel(a, d) < 1e-5 if d.abs().max() > 0 else torch.equal(a, d)
    gw = sparse[1]
    carrying = gy.reshape(-1, OUT).ne(0).any(0)
    assert torch.equal(gw[~carrying], torch.zeros_like(gw[~carrying]))  # zero rows stay exactly zero


def test_sparse_backward_takes_non_contiguous_spikes_and_no_weight_grad():
    torch.manual_seed(1)
    base = (torch.rand(3, 4, 2, 19) < 0.4).float().to(DEVICE)
    s = base[:, :, 1].requires_grad_()  # a non-contiguous view [3, 4, 19]
    w = torch.randn(23, 19, device=DEVICE)  # frozen: only the input gradient
    gy = _sparse_gy((3, 4), 23, 0.3, seed=2).to(DEVICE)
    (gs,) = torch.autograd.grad(sparse_spike_linear(s, w, None), s, gy)
    assert rel(gs, gy @ w) < 1e-5


def test_carrying_columns_lists_nonzero_columns():
    gy = torch.zeros(4, 9, device=DEVICE)
    gy[2, 7] = 1.0
    gy[0, 3] = -2.0
    cols, count = carrying_columns(gy)
    assert int(count) == 2 and cols[:2].tolist() == [3, 7]


def test_secondary_threshold_minus_inf_reproduces_dense_gradients():
    """theta_grad = -inf: every neuron carries gradient; the sparse network's gradients are
    the dense network's."""
    torch.manual_seed(0)
    dense = IPUNet((12,), 3, hidden=(17, 13), backend="fused").to(DEVICE)
    sparse = IPUNet((12,), 3, hidden=(17, 13), backend="fused", sparse="sparse",
                    grad_threshold=float("-inf")).to(DEVICE)
    sparse.load_state_dict(dense.state_dict())
    x = (torch.rand(6, 4, 12) < 0.5).float().to(DEVICE) * 3
    y = torch.tensor([0, 1, 2, 1], device=DEVICE)
    for model in (dense, sparse):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    for (name, a), b in zip(sparse.named_parameters(), dense.parameters()):
        assert rel(a.grad, b.grad) < 1e-5, name


def test_secondary_threshold_makes_gradients_sparse_and_matches_its_dense_twin():
    """With theta_grad = 0.9 the sparse backward equals the dense backward with the same
    cut, and the hidden layer's weight gradient has zero rows."""
    torch.manual_seed(3)
    kwargs = dict(hidden=(40, 30), backend="fused", sparse="sparse", grad_threshold=0.9)
    sparse = IPUNet((20,), 4, **kwargs).to(DEVICE)
    dense = IPUNet((20,), 4, **kwargs).to(DEVICE)
    dense.load_state_dict(sparse.state_dict())
    for m in dense.modules():
        if isinstance(m, SparseSpikingLinear):
            m.sparse = False
    x = (torch.rand(8, 3, 20) < 0.4).float().to(DEVICE) * 4
    y = torch.tensor([0, 1, 3], device=DEVICE)
    for model in (dense, sparse):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    for a, b in zip(sparse.parameters(), dense.parameters()):
        assert rel(a.grad, b.grad) < 1e-5 if b.grad.abs().max() > 0 else torch.equal(a.grad, b.grad)
    hidden = next(m for m in sparse.modules() if isinstance(m, SparseSpikingLinear))
    zero_rows = (hidden.weight.grad == 0).all(1)
    assert 0 < zero_rows.sum() < hidden.out_features  # some outputs carried gradient, not all
    assert all(lif.grad_threshold == 0.9 for lif in sparse.modules() if isinstance(lif, LIF))


def test_lazy_adam_is_adam_where_every_row_has_gradient_and_skips_zero_rows():
    torch.manual_seed(0)
    p1 = torch.randn(9, 13, device=DEVICE, requires_grad=True)
    b1 = torch.randn(9, device=DEVICE, requires_grad=True)
    p2, b2 = (t.detach().clone().requires_grad_() for t in (p1, b1))
    lazy, adam = LazyAdam([p1, b1], lr=1e-2), torch.optim.Adam([p2, b2], lr=1e-2)
    for _ in range(3):
        g, gb = torch.randn(9, 13, device=DEVICE) + 0.1, torch.randn(9, device=DEVICE) + 0.1
        p1.grad, p2.grad, b1.grad, b2.grad = g.clone(), g.clone(), gb.clone(), gb.clone()
        lazy.step()
        adam.step()
    assert rel(p1.detach(), p2.detach()) < 1e-5 and rel(b1.detach(), b2.detach()) < 1e-5
    before = p1.detach().clone()
    moments = lazy.state[p1]["exp_avg"].clone()
    g = torch.randn(9, 13, device=DEVICE)
    g[[1, 4]] = 0
    p1.grad = g
    lazy.step()
    assert torch.equal(p1.detach()[[1, 4]], before[[1, 4]])
    assert torch.equal(lazy.state[p1]["exp_avg"][[1, 4]], moments[[1, 4]])
    assert (p1.detach()[[0, 2, 3]] != before[[0, 2, 3]]).all()


def _sparse_net(seed):
    torch.manual_seed(seed)
    return IPUNet((20,), 4, hidden=(40, 30), backend="fused", sparse="sparse", grad_threshold=0.9).to(DEVICE)


@pytest.mark.slow  # 7 s on 2 cores
def test_lazy_adam_on_the_backwards_note_equals_lazy_adam_searching_the_gradient():
    """The sparse backward notes the rows it wrote; LazyAdam reads only those, and the
    result is bit for bit the search's over every row."""
    noted, searched = _sparse_net(3), _sparse_net(3)
    opt_noted, opt_searched = LazyAdam(noted.parameters(), lr=1e-2), LazyAdam(searched.parameters(), lr=1e-2)
    x = (torch.rand(8, 3, 20) < 0.4).float().to(DEVICE) * 4
    y = torch.tensor([0, 1, 3], device=DEVICE)
    for _ in range(3):
        for model, opt in ((noted, opt_noted), (searched, opt_searched)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        layers = [m for m in noted.modules() if isinstance(m, SparseSpikingLinear)]
        assert all(getattr(m.weight, grad_rows.ATTRIBUTE) is not None for m in layers)
        for m in searched.modules():
            if isinstance(m, SparseSpikingLinear):
                grad_rows.clear(m.weight)
        opt_noted.step()
        opt_searched.step()
        assert all(getattr(m.weight, grad_rows.ATTRIBUTE) is None for m in layers)  # one use
    for (name, a), b in zip(noted.named_parameters(), searched.parameters()):
        assert torch.equal(a, b), name


def test_a_note_is_trusted_only_while_it_describes_the_gradient():
    layer = SparseSpikingLinear(6, 5, bias=False, backward="sparse").to(DEVICE)
    silent = torch.zeros(3, 2, 6, device=DEVICE)  # no input spike: every row of dW is zero
    layer(silent).sum().backward()
    assert grad_rows.take(layer.weight) is not None
    layer(silent).sum().backward()  # accumulated in place into the same tensor
    assert grad_rows.take(layer.weight) is None
    layer.weight.grad = None
    layer(silent).sum().backward()
    layer.weight.grad.add_(1.0)  # edited in place after the backward
    assert grad_rows.take(layer.weight) is None
    opt = LazyAdam(layer.parameters(), lr=1e-2)
    layer.weight.grad = None
    layer(silent).sum().backward()
    opt.zero_grad()
    assert getattr(layer.weight, grad_rows.ATTRIBUTE) is None
    layer(silent).sum().backward()
    x = torch.zeros(3, 2, 6, device=DEVICE, requires_grad=True)
    torch.autograd.grad(layer(x).sum(), x)  # the weight's gradient is made, noted, and thrown away
    layer.weight.grad = torch.zeros_like(layer.weight)  # a new gradient, perhaps in the freed memory
    assert grad_rows.take(layer.weight) is None
    layer.sparse = False  # a dense backward clears the note its sparse one left
    layer.weight.grad = None
    layer(silent).sum().backward()
    assert getattr(layer.weight, grad_rows.ATTRIBUTE) is None


def test_lazy_adam_skips_noted_rows_whose_gradient_is_zero():
    layer = SparseSpikingLinear(6, 5, bias=False, backward="sparse").to(DEVICE)
    before = layer.weight.detach().clone()
    opt = LazyAdam(layer.parameters(), lr=1e-2)
    layer(torch.zeros(3, 2, 6, device=DEVICE)).sum().backward()  # every output carries, dW = 0
    opt.step()
    assert torch.equal(layer.weight.detach(), before)
    assert not opt.state[layer.weight]["exp_avg"].any()


@pytest.mark.parametrize("noted", [False, True])
def test_lazy_adam_work_items_cover_wide_rows_exactly_once(noted, monkeypatch):
    """Rows wider than one block (2500 columns: 3 blocks of 1024) and fewer programs than
    work items: each listed row with gradient is Adam's, a listed all-zero row and an unlisted
    row stay as they were."""
    from spikefuse.ops import lazy_adam
    monkeypatch.setattr(lazy_adam, "PROGRAMS", 3)
    torch.manual_seed(0)
    p = torch.randn(6, 2500, device=DEVICE) * 1e-3  # small: its rounding stays far below the updates' 1e-5
    g = torch.randn(6, 2500, device=DEVICE)
    g[2] = 0  # listed (when noted) but all zero
    g[4] = 0  # never listed
    lazy, ref = p.clone(), p.clone().requires_grad_()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    step = torch.ones((), device=DEVICE)
    rows = torch.tensor([5, 0, 2, 3, 1], device=DEVICE, dtype=torch.int32)
    candidates = (rows, torch.tensor([5], device=DEVICE, dtype=torch.int32)) if noted else None
    lazy_adam.lazy_adam_step(lazy, g, m, v, step, 1e-2, 0.9, 0.999, 1e-8, candidates)
    ref.grad = g.clone()
    torch.optim.Adam([ref], lr=1e-2).step()
    updated = [0, 1, 3, 5]
    assert rel((lazy - p)[updated], (ref.detach() - p)[updated]) < 1e-5  # the updates themselves
    assert torch.equal(lazy[[2, 4]], p[[2, 4]]) and not m[[2, 4]].any() and not v[[2, 4]].any()


def test_lazy_adam_takes_a_tensor_learning_rate_and_rejects_bad_arguments():
    p = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    opt = LazyAdam([p], lr=torch.tensor(1e-2, device=DEVICE))
    ref = LazyAdam([q], lr=1e-2)
    p.grad = q.grad = torch.ones(3, 4, device=DEVICE)
    opt.step()
    ref.step()
    assert torch.equal(p, q)
    with pytest.raises(ValueError, match="lr"):
        LazyAdam([p], lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        LazyAdam([p], betas=(0.9, 1.0))
    p.grad = torch.ones(3, 4, device=DEVICE).to_sparse()
    with pytest.raises(ValueError, match="SparseAdam"):
        opt.step()


@pytest.mark.parametrize("capacity", [1, 7, 64, 200])
@pytest.mark.parametrize("T,B,IN,OUT,share", [(5, 3, 37, 41, 0.2), (1, 1, 17, 70, 0.05), (3, 2, 130, 33, 1.0),
                                              (2, 5, 65, 129, 0.0), (4, 3, 136, 50, 0.3)])
def test_sparse_backward_with_a_capacity_equals_dense(T, B, IN, OUT, share, capacity):
    """The first `capacity` carrying columns through cuBLAS (W's rows gathered, the weight
    gradient's rows scattered), the rest through the Triton kernels: the same gradients as the
    dense backward whether the capacity is under, at or past the count (and past OUT)."""
    torch.manual_seed(T * 100 + OUT)
    s = (torch.rand(T, B, IN) < 0.3).float().to(DEVICE)
    w = torch.randn(OUT, IN, device=DEVICE, requires_grad=True)
    gy = _sparse_gy((T, B), OUT, share, seed=OUT).to(DEVICE)
    grads = []
    for op in (lambda x: sparse_spike_linear(x, w, None, capacity=capacity), lambda x: spike_linear(x, w, None)):
        x = s.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # not contiguous
        grads.append(torch.autograd.grad(op(x), (x, w), gy))
    for a, d in zip(*grads):
        assert rel(a, d) < 1e-5 if d.abs().max() > 0 else torch.equal(a, d)
    carrying = gy.reshape(-1, OUT).ne(0).any(0)
    assert torch.equal(grads[0][1][~carrying], torch.zeros_like(grads[0][1][~carrying]))


def test_gather_carrying_zeroes_the_rows_up_to_the_capacity():
    gy = torch.zeros(3, 20)
    gy[:, [2, 5]] = 1.0
    gyt, cols, count = gather_carrying(gy.to(DEVICE), capacity=6)
    assert int(count) == 2 and torch.equal(gyt[:6].cpu(), torch.cat([gy[:, [2, 5]].t(), torch.zeros(4, 3)]))


def test_dispatch_sets_the_capacity_from_the_largest_count_and_keeps_it_within_a_band():
    layer = SparseSpikingLinear(30, 300, bias=False, backward="sparse")
    for most, expected, changed in ((100, 128, True), (110, 128, False), (128, 128, False), (130, 192, True),
                                    (60, 192, False), (40, 64, True), (0, 0, True), (1000, 300, True)):
        layer.carry.copy_(torch.tensor([most * 2.0, 3.0, most]))
        assert update_dispatch(layer) is changed and layer.capacity == expected, (most, layer.capacity)
    layer.carry.zero_()  # no backward since: nothing measured, nothing changes
    assert update_dispatch(layer) is False and layer.capacity == 300


@pytest.mark.parametrize("shape", [(37, 1100), (1, 1), (5, 3), (0, 7), (6, 0), (130, 41)])
@pytest.mark.parametrize("over", [0, 1])
def test_line_flags_match_torch_on_strided_inputs_with_nan(shape, over):
    gen = torch.Generator().manual_seed(shape[0] * 31 + shape[1])
    base = torch.randn(shape[0], 2 * shape[1], generator=gen)
    base[torch.rand(base.shape, generator=gen) < 0.97] = 0.0
    if base.numel():
        base.view(-1)[base.numel() // 3] = float("nan")
    x = base.to(DEVICE)[:, ::2]  # columns two apart
    expected = base[:, ::2].isnan().logical_or(base[:, ::2] != 0).any(over).to(torch.uint8)
    assert torch.equal(line_flags(x, over).cpu(), expected)


@pytest.mark.parametrize("R,OUT", [(13, 2100), (1, 1), (9, 40), (0, 5), (4, 0)])
def test_gather_carrying_lists_in_order_and_gathers_transposed(R, OUT):
    gen = torch.Generator().manual_seed(R + OUT)
    gy = torch.randn(R, OUT, generator=gen) * (torch.rand(OUT, generator=gen) < 0.1)
    gyt, cols, count = gather_carrying(gy.to(DEVICE))
    expected = torch.nonzero(gy.ne(0).any(0)).flatten()
    n = int(count)
    assert n == expected.numel() and cols[:n].cpu().tolist() == expected.tolist()
    assert torch.equal(gyt[:n].cpu(), gy[:, expected].t())


def test_nonzero_rows():
    g = torch.zeros(5, 3, device=DEVICE)
    g[3, 1] = 1.0
    rows, count = nonzero_rows(g)
    assert int(count) == 1 and int(rows[0]) == 3


def test_dispatch_follows_the_measured_carrying_share():
    torch.manual_seed(0)
    layer = SparseSpikingLinear(10, 8, bias=False, sparse_below=0.25).to(DEVICE)
    s = (torch.rand(2, 3, 10) < 0.5).float().to(DEVICE)
    gy = torch.zeros(2, 3, 8, device=DEVICE)
    gy[..., :4] = 1.0  # half the outputs carry gradient: dense pays
    layer(s).backward(gy)
    assert layer.sparse and update_dispatch(layer) and not layer.sparse
    gy.zero_()
    gy[..., 0] = 1.0  # one output in 8: back to sparse (the dense backward counts too)
    layer(s).backward(gy)
    assert update_dispatch(layer) and layer.sparse
    assert not update_dispatch(layer)  # nothing measured since: no change
    fixed = SparseSpikingLinear(10, 8, backward="dense").to(DEVICE)
    fixed(s).backward(torch.ones(2, 3, 8, device=DEVICE))
    assert not update_dispatch(fixed) and not fixed.sparse


def test_sparse_layer_and_model_reject_bad_options():
    with pytest.raises(ValueError, match="backward"):
        SparseSpikingLinear(3, 4, backward="fast")
    with pytest.raises(ValueError, match="sparse_below"):
        SparseSpikingLinear(3, 4, sparse_below=2.0)
    with pytest.raises(ValueError, match="sparse"):
        IPUNet((5,), 2, hidden=(4,), sparse="yes")
    with pytest.raises(ValueError, match="fused"):
        IPUNet((5,), 2, hidden=(4,), sparse=True, fused=False)
    with pytest.raises(ValueError, match="in_features"):
        SparseSpikingLinear(3, 4)(torch.zeros(2, 2, 5))


def test_sparse_model_cuts_per_neuron_over_the_batch():
    """IPUNet(sparse=True): its feed-forward LIFs decide the cut per position over the batch
    (grad_scope "batch"), which lif= can set back to the study's per-step rule; the recurrent
    variant's cut is per step, and a grad_scope for it is refused."""
    from spikefuse.nn import LIF

    def scopes(model):
        return {m.grad_scope for m in model.modules() if isinstance(m, LIF)}
    assert scopes(IPUNet((6,), 2, hidden=(5, 4), sparse=True)) == {"batch"}
    assert scopes(IPUNet((6,), 2, hidden=(5, 4), sparse=True, grad_scope="step")) == {"step"}
    assert scopes(IPUNet((6,), 2, hidden=(5, 4))) == {"step"}
    counting = IPUNet((6,), 2, hidden=(5, 4), sparse=True, readout="count")
    assert [m.grad_scope for m in counting.modules() if isinstance(m, LIF)] == ["batch", "batch", "step"]
    with pytest.raises(ValueError, match="grad_scope"):
        IPUNet((6,), 2, hidden=(5, 4), sparse=True, recurrent=True, grad_scope="batch")
    IPUNet((6,), 2, hidden=(5, 4), sparse=True, recurrent=True, grad_scope="step")  # what it does anyway


def test_sparse_model_state_dict_matches_dense():
    dense, sparse = IPUNet((6,), 2, hidden=(5, 4)), IPUNet((6,), 2, hidden=(5, 4), sparse=True)
    assert dense.state_dict().keys() == sparse.state_dict().keys()


def test_trainer_redispatches_after_each_epoch():
    """fit() calls update_dispatch after every epoch: with sparse_below = 0 any measured
    carrying share sends an "auto" layer to the dense backward."""
    from torch.utils.data import DataLoader, TensorDataset

    from spikefuse.train import fit

    torch.manual_seed(0)
    model = IPUNet((12,), 3, hidden=(16, 16), sparse=True, grad_threshold=float("-inf"))
    layer = next(m for m in model.modules() if isinstance(m, SparseSpikingLinear))
    layer.sparse_below = 0.0
    x = (torch.rand(16, 5, 12) < 0.5).float() * 2  # batch-first [B, T, F], as DataLoaders give
    y = torch.randint(0, 3, (16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    assert layer.sparse
    fit(model, (loader, loader), LazyAdam(model.parameters(), lr=1e-3), epochs=1, progress=False)
    assert not layer.sparse


def test_without_triton_the_sparse_layer_and_lazy_adam_run_in_torch(monkeypatch):
    """Where Triton cannot run (a CPU without the interpreter, e.g. a CPU model on a GPU
    machine) the sparse layer takes the dense backward and LazyAdam its torch twin: the same
    training step as with the kernels, not a Triton error."""
    import spikefuse.ops.sparse_linear as sparse_ops
    import spikefuse.optim as optim

    def train_step(model):
        opt = LazyAdam(model.parameters(), lr=1e-2)
        x = (torch.rand(5, 4, 12, generator=torch.Generator().manual_seed(3)) < 0.5).float() * 2
        torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 1])).backward()  # [B, classes]
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(0)
    model = IPUNet((12,), 3, hidden=(16, 16), sparse="sparse", grad_threshold=0.5)
    twin = IPUNet((12,), 3, hidden=(16, 16), sparse="sparse", grad_threshold=0.5)
    twin.load_state_dict(model.state_dict())
    with_kernels = train_step(model)
    for module in (sparse_ops, optim):
        monkeypatch.setattr(module, "use_triton", lambda t: False)
    without = train_step(twin)
    for a, b in zip(with_kernels, without):
        assert rel(b, a) < 1e-5 if a.abs().max() > 0 else torch.equal(a, b)


def test_dispatch_warns_when_no_gradient_flows():
    """A network silent under its secondary threshold gets no gradient at all: said, not silent."""
    from spikefuse.nn.sparse_linear import NoGradientWarning

    layer = SparseSpikingLinear(6, 5).to(DEVICE)
    s = (torch.rand(2, 3, 6) < 0.5).float().to(DEVICE)
    layer(s).backward(torch.zeros(2, 3, 5, device=DEVICE))
    with pytest.warns(NoGradientWarning, match="grad_threshold"):
        update_dispatch(layer)
    layer(s).backward(torch.ones(2, 3, 5, device=DEVICE))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGradientWarning)
        update_dispatch(layer)
