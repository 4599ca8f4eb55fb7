import os

# Fused kernels run on the CPU through Triton's interpreter; it must be chosen before
# triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
