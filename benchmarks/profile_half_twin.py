"""The kernels of CIFAR-medium's fp32 step with TF32 weight gradients and with the fp16 twin
(spikefuse.ops.half_grad): three eager steps of each under the profiler, by kernel and by op.

    PYTHONPATH=src python benchmarks/profile_half_twin.py > profile.txt
"""
import copy

import torch
from torch.profiler import ProfilerActivity, profile

from spikefuse import precision
from spikefuse.bench.steps import make_inputs, make_model, make_optimizer, step_function
from spikefuse.nn.spiking_layers import ConvBNLIF


def main():
    with precision.applied("fp32"):
        torch.manual_seed(0)
        template, shapes, classes = make_model("cifar-medium", 1.0, "auto")
        template = template.cuda()
        inputs = make_inputs(shapes, classes, 64, torch.device("cuda"))
        for twin in (False, True):
            model = copy.deepcopy(template)
            for m in model.modules():
                if isinstance(m, ConvBNLIF):
                    m.half_twin = twin
            step = step_function(model, model, make_optimizer("sgd", model.parameters()), "fp32")
            for _ in range(3):
                step(*inputs[0])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU], record_shapes=True) as prof:
                for _ in range(3):
                    step(*inputs[0])
                torch.cuda.synchronize()
            print("=== twin", twin, "(3 steps)")
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
