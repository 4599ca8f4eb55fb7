"""Why test_bn_lif_beyond_2_31_elements fails on an H100: gx where dL/dy = 0 against Eq. 8's
mean terms, and the per-channel sums, at 2^31+ elements against a 2^30-element control."""
import torch

from spikefuse.nn import BNLIF
from spikefuse.ops import bn_lif

for B in (2**12, 2**14):
    shape = (9, B, 1, 128, 128)
    T, N = 9, B * 128 * 128
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_()
    m = BNLIF(1, decay=0.6, threshold=0.4, surrogate="atan", backend="fused").cuda()
    s = m(x)
    gs = torch.zeros_like(s)
    cols = torch.tensor([0, 5, N // 2 + 7, N - 1], device="cuda")
    gs.view(T, N)[:, cols] = 1.0
    captured = {}
    orig = bn_lif._channel_sums

    def spy(part, shape, cl):
        out = orig(part, shape, cl)
        captured["sums"] = out.clone()
        captured["part_nonzero"] = int((part != 0).sum())
        return out
    bn_lif._channel_sums = spy
    (gx,) = torch.autograd.grad(s, x, gs)
    bn_lif._channel_sums = orig
    far = gx.view(T, N)[:, N // 3].float()
    print(f"B={B} elements={T * N} (>2^31: {T * N > 2**31}) sums={captured['sums'].flatten().tolist()} "
          f"part nonzeros={captured['part_nonzero']} gx far col (per t)={far.tolist()[:4]} "
          f"gx at cols t=0: {gx.view(T, N)[0, cols].float().tolist()}", flush=True)
    del x, s, gs, gx
    torch.cuda.empty_cache()
