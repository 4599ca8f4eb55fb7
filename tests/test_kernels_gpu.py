"""Kernel guarantees only a GPU can show (issue 14); marked `gpu`, skipped without CUDA. On a
GPU machine `python -m pytest -q tests/test_kernels_gpu.py` runs them:
  - every launch runs on its tensors' device (tensors on cuda:1 while cuda:0 is current;
    needs 2 GPUs);
  - 64-bit offsets: LIF and BN+LIF with more than 2^31 elements (about 40 GB of GPU memory
    at most, one test at a time), checked against the reference computed on slices;
  - BN+LIF with more than 65535 time steps (a grid's second dimension);
  - a CUDA out-of-memory error through `spikefuse train` is one line, exit code 1."""
import copy
import subprocess
import sys

import pytest
import torch

import spikefuse.functional as F
from spikefuse import reference
from spikefuse.nn import BNLIF
from spikefuse.ops.bn_lif import _statistics
from spikefuse.surrogates import spike
from helpers import rel_err

pytestmark = pytest.mark.gpu


def free_memory_gb():
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0] / 2**30


def randn(shape, seed, device, dtype=torch.float32, shift=0.3):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=device) + shift).to(dtype)


# ---- device guard ----

def lif_run(x, decay):
    x = x.detach().clone().requires_grad_()
    d = decay.detach().clone().requires_grad_()
    spikes, v = F.plif(x, d, return_state=True, surrogate="atan", backend="fused")
    g = torch.linspace(-1, 1, spikes.numel(), device=x.device).view(spikes.shape)
    ((spikes * g).sum() + v.sum()).backward()
    return spikes, v, x.grad, d.grad


@pytest.mark.multi_gpu
def test_launches_follow_the_tensors_device():
    """With cuda:0 current, LIF, BN+LIF and spike packing on cuda:1 tensors run on cuda:1
    (without the guard Triton launched them on cuda:0: an illegal address) and give what
    they give on cuda:0; the current device is left as it was."""
    from spikefuse.ops.spike_pack import pack, unpack

    torch.cuda.set_device(0)
    x0 = randn((9, 4, 6, 5), 0, "cuda:0")
    decay0 = torch.linspace(0.3, 0.9, 6, device="cuda:0")
    on0 = lif_run(x0, decay0)
    on1 = lif_run(x0.to("cuda:1"), decay0.to("cuda:1"))
    assert torch.cuda.current_device() == 0
    for a, b in zip(on0, on1):
        assert b.device == torch.device("cuda:1")
        assert torch.equal(a, b.to("cuda:0"))

    module0 = BNLIF(6, threshold=0.3, learn_decay=True, backend="fused").to("cuda:0")
    module1 = copy.deepcopy(module0).to("cuda:1")
    xb = randn((7, 3, 6, 4, 4), 1, "cuda:0", shift=0.0)
    results = []
    for module, x in ((module0, xb), (module1, xb.to("cuda:1"))):
        x = x.detach().clone().requires_grad_()
        s = module(x)
        (s * torch.linspace(-1, 1, s.numel(), device=x.device).view(s.shape)).sum().backward()
        results.append([s, x.grad, module.weight.grad, module.bias.grad, module.decay_logit.grad,
                        module.running_mean, module.running_var])
    assert torch.cuda.current_device() == 0
    for a, b in zip(*results):
        torch.testing.assert_close(a, b.to("cuda:0"), rtol=0, atol=0)

    s = (randn((5, 77), 2, "cuda:1") > 0.3).float()
    assert torch.equal(unpack(pack(s), s.shape, s.dtype), s)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0


# ---- more than 2^31 elements ----

@pytest.mark.whole_gpu
def test_lif_beyond_2_31_elements():
    """T * N > 2^31 in bfloat16 (~21 GB): the last neurons' spikes and gradients at the
    last steps (offsets past 2^31) equal the reference run on those neurons alone."""
    T, N = 17, 2**27  # 2.28e9 elements
    if free_memory_gb() < 28:
        pytest.skip("needs ~28 GB of free GPU memory")
    x = torch.empty((T, N), device="cuda", dtype=torch.bfloat16)
    for t in range(T):  # in pieces: no float32 copy of the whole
        x[t] = randn((N,), t, "cuda", torch.bfloat16, shift=0.4)
    x.requires_grad_()
    spikes = F.lif(x, decay=0.8, threshold=0.9, reset="soft", surrogate="sigmoid", backend="fused")
    grad_s = torch.empty_like(spikes)
    for t in range(T):
        grad_s[t] = randn((N,), 100 + t, "cuda", torch.bfloat16, shift=0.0)
    (gx,) = torch.autograd.grad(spikes, x, grad_s)
    cols = torch.tensor([0, 1, N // 2 + 3, N - 65, N - 2, N - 1], device="cuda")
    xr = x.detach()[:, cols].float().requires_grad_()
    sr = reference.lif(xr, 0.8, 0.9, "soft", 0.0, False, "sigmoid", None)
    (gr,) = torch.autograd.grad(sr, xr, grad_s[:, cols].float())
    assert torch.equal(spikes[:, cols].float(), sr)
    assert rel_err(gx[:, cols].float(), gr) < 1e-2  # gx is bfloat16
    del x, spikes, grad_s, gx


@pytest.mark.whole_gpu
def test_bn_lif_beyond_2_31_elements():
    """[9, 2^14, 1, 128, 128] in bfloat16: 2.4e9 elements, one channel, so the statistics
    pass also indexes more than 2^31 rows (~40 GB with the backward). Statistics against
    float64 sums in pieces; spikes of some neurons (the last ones included) against the
    reference LIF on y = x * a + b; dL/dx against Eq. 8 with dL/dy nonzero at those neurons only."""
    shape = (9, 2**14, 1, 128, 128)
    if free_memory_gb() < 44:
        pytest.skip("needs ~44 GB of free GPU memory")
    T, N = shape[0], 2**28
    x = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    flat = x.view(T, N)
    total, total_sq = torch.zeros((), dtype=torch.float64, device="cuda"), torch.zeros((), dtype=torch.float64, device="cuda")
    for t in range(T):
        flat[t] = randn((N,), t, "cuda", torch.bfloat16, shift=0.5)
        total += flat[t].double().sum()
    count = T * N
    mean = total / count
    for t in range(T):
        total_sq += ((flat[t].double() - mean) ** 2).sum()
    var = total_sq / count
    module = BNLIF(1, decay=0.6, threshold=0.4, surrogate="atan", backend="fused").cuda()
    with torch.no_grad():
        module.weight.fill_(1.3)
        module.bias.fill_(0.1)
    x.requires_grad_()
    spikes = module(x)
    rm, rv = module.running_mean.double(), module.running_var.double()
    torch.testing.assert_close(rm, 0.1 * mean.view(1), rtol=1e-5, atol=0)
    torch.testing.assert_close(rv, 0.9 + 0.1 * var.view(1) * count / (count - 1), rtol=1e-5, atol=0)

    cols = torch.tensor([0, 5, N // 2 + 7, N - 129, N - 2, N - 1], device="cuda")
    with torch.no_grad():  # the kernel's own statistics (checked above), for its exact y = x * a + b
        mu, invstd, a, b = _statistics(x, module.weight, module.bias, None, None, True, 0.1, module.eps)
    y = flat.detach()[:, cols].float() * a + b
    assert torch.equal(spikes.view(T, N)[:, cols].float(), reference.lif(y, 0.6, 0.4, "hard", 0.0, False, "atan", None))

    grad_s = torch.zeros_like(spikes)
    g_cols = randn((T, len(cols)), 7, "cuda", torch.bfloat16, shift=0.0)
    grad_s.view(T, N)[:, cols] = g_cols
    (gx,) = torch.autograd.grad(spikes, x, grad_s)
    yr = y.clone().requires_grad_()
    (gy,) = torch.autograd.grad(reference.lif(yr, 0.6, 0.4, "hard", 0.0, False, "atan", None), yr, g_cols.float())
    xhat = (flat.detach()[:, cols].double() - mu.double()) * invstd.double()
    mgy, mgyx = gy.double().sum() / count, (gy.double() * xhat).sum() / count
    expected = a.double() * (gy.double() - mgy - xhat * mgyx)
    assert rel_err(gx.view(T, N)[:, cols].float(), expected) < 1e-2  # gx is bfloat16
    # points outside cols (dL/dy = 0 there): Eq. 8's mean terms only
    far = [(T - 1, N - 1000), (T - 1, N - 3), (T // 2, N // 3)]
    for t, n in far:
        xh = (flat[t, n].double() - mu.double()) * invstd.double()
        torch.testing.assert_close(gx.view(T, N)[t, n].double(), (a.double() * (-mgy - xh * mgyx)).view(()),
                                   rtol=1e-2, atol=1e-12)
    del x, spikes, grad_s, gx


def test_bn_lif_more_time_steps_than_a_grid_dimension():
    """T = 70000 > 65535 (CUDA's limit on a grid's second dimension, where dL/dx's kernel
    put the time steps). decay = 0: each step is independent, so the reference is vectorised."""
    module = BNLIF(4, decay=0.0, threshold=0.2, surrogate="triangle", backend="fused").cuda()
    ref = copy.deepcopy(module)
    x = randn((70000, 2, 4), 3, "cuda", shift=0.0)
    grad_s = randn((70000, 2, 4), 4, "cuda", shift=0.0)
    xf = x.clone().requires_grad_()
    spikes = module(xf)
    (gf,) = torch.autograd.grad(spikes, xf, grad_s)
    with torch.no_grad():  # the kernel's statistics: its exact y, so spikes compare exactly
        _, _, a, b = _statistics(x, module.weight, module.bias, None, None, True, 0.1, module.eps)
    assert torch.equal(spikes, (x * a + b >= 0.2).float())
    xr = x.clone().requires_grad_()  # the reference gradient: torch batch norm, then the surrogate
    y = torch.nn.functional.batch_norm(xr.flatten(0, 1), ref.running_mean, ref.running_var, ref.weight,
                                       ref.bias, True, 0.1, ref.eps).view(x.shape)
    (gr,) = torch.autograd.grad(spike(y - 0.2, "triangle", 1.0), xr, grad_s)
    assert rel_err(gf, gr) < 1e-5


# ---- out of memory through the command line ----

def test_out_of_memory_through_spikefuse_train_is_one_line(tmp_path):
    """A real CUDA out-of-memory error (the allocator capped at a few MB) inside
    `spikefuse train`: exit code 1, one line naming what to lower, no traceback."""
    entry = ("import sys, torch; torch.cuda.set_per_process_memory_fraction(4 * 2**20 / "
             "torch.cuda.get_device_properties(0).total_memory); "
             "from spikefuse.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", entry, "train", "--device", "cuda", "--epochs", "1",
                           "--batch-size", "1024", "--no-capture", "--quiet", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.strip().splitlines() if ": warning: " not in line and line.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "out of memory" in lines[0] and "lower --batch-size or --time-steps" in lines[0], lines[0]
