import os

# SPIKEFUSE_TEST_DEVICE=cuda runs the kernel tests compiled on a GPU; otherwise the fused
# kernels run on the CPU through Triton's interpreter, chosen before triton is imported.
if os.environ.get("SPIKEFUSE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
