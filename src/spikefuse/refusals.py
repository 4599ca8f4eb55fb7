"""What the command line refuses today, in one place.

Each entry is a combination that `spikefuse` answers with one line and exit code 2 instead of
running it. The code that refuses quotes these texts, and the CLI matrix test
(tests/test_cli_matrix.py) expects exactly these refusals and a clean run everywhere else, so
the list shrinks as support grows (the NIR export entries first).
"""
from __future__ import annotations

# spikefuse train --sparse --compile: dynamo would trace the sparse layers as the dense ones
SPARSE_COMPILE = ("--sparse and --compile: the sparse backward runs its own kernels, which torch.compile "
                  "traces as the dense layer; drop --compile (the step is still captured on CUDA)")

# spikefuse export --nir: models (by registry name) whose layers the NIR graph cannot hold ->
# the reason spikefuse.nir.to_nir gives
NIR_EXPORT = {
    **dict.fromkeys(("resnet18", "resnet34"), "residual connections"),
    "dvs-gesture": "max pooling",
}
