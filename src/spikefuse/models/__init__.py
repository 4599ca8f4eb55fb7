"""Ready networks, by name. Add an entry to MODELS: name -> (builder, description);
a builder takes (input_shape, num_classes, time_steps, **kwargs) and returns a module
mapping time-major input [T, B, *input_shape] to logits [B, num_classes]."""
from __future__ import annotations

import inspect

from ..nn.layers import checked_shape
from . import mlp

MODELS = {
    "mlp": (mlp.build, "spiking MLP: Linear-LIF x2 (256 units), mean-over-time linear readout"),
}


CONVOLUTIONAL = {"cifar-small", "cifar-medium", "cifar-large", "resnet18", "resnet34", "dvs-gesture"}


def takes_images(name: str) -> bool:
    """Whether the model's builder needs input_shape (C, H, W) (its first layers convolve)."""
    return name in CONVOLUTIONAL


def trains_sparse(name: str) -> bool:
    """Whether the model has a sparse training path (its builder takes sparse=True and the
    network has fluctuation_init_): the IPU study's networks."""
    return getattr(MODELS[name][0], "sparse_training", False)


def takes_static_images(name: str) -> bool:
    """Whether the model takes static images [B, C, H, W] (repeated over time inside it), as
    cifar-synthetic's batches are, besides time-major input."""
    return getattr(MODELS[name][0], "static_images", False)


def build_model(name: str, input_shape, num_classes: int, time_steps: int | None = None, **kwargs):
    """Build a registered model; unknown names raise ValueError listing the valid ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    builder, _ = MODELS[name]
    shape = checked_shape(input_shape, num_classes)  # as every model's constructor checks them
    # these builders unpack (C, H, W): other shapes failed inside them, naming their code
    if takes_images(name) and len(shape) != 3:
        default = inspect.signature(builder).parameters["input_shape"].default
        raise ValueError(f"input_shape: model {name!r} takes images [C, H, W] like {tuple(default)}, got {shape}")
    return builder(shape, num_classes, time_steps, **kwargs)


__all__ = ["MODELS", "build_model", "takes_images", "takes_static_images", "trains_sparse"]

from . import cifar, deep_lif, dvs, ipu, resnet, shd  # noqa: E402

MODELS.update({
    "cifar-small": (cifar.build_small, "Liang et al. small CIFAR net: 128C-256C-512C-1024FC-512FC, BN-LIF"),
    "cifar-medium": (cifar.build_medium, "Liang et al. medium CIFAR net: 7 convs (128..512)-1024FC-512FC, BN-LIF"),
    "cifar-large": (cifar.build_large, "Liang et al. large CIFAR net: 9 convs (128..512)-1024FC-512FC, BN-LIF"),
    "resnet18": (resnet.build_resnet18, "spiking ResNet-18 (BN+residual+LIF fused), rate readout"),
    "resnet34": (resnet.build_resnet34, "spiking ResNet-34 (BN+residual+LIF fused), rate readout"),
    "shd": (shd.build, "SHD feed-forward net: 700 -> 256 BN-LIF -> 20"),
    "dvs-gesture": (dvs.build, "DVS128 Gesture conv net: conv128-BN-LIF-maxpool blocks, FC512, 11 classes"),
    "ipu-shd": (ipu.build_shd, "IPU study's SHD net: 700-1472-1470-20 LIF (decay 0.95), T=100, mean-over-time readout"),
    "ipu-nmnist": (ipu.build_nmnist, "IPU study's N-MNIST net: 2x34x34-1472-1470-10 LIF (decay 0.95), T=100, mean readout"),
    "ipu-dvsgesture": (ipu.build_dvsgesture,
                       "IPU study's DVS-Gesture net: 2x48x48-1472-1470-11 LIF (decay 0.95), T=50, mean readout"),
    "ipu-shd-recurrent": (ipu.build_shd_recurrent, "ipu-shd with recurrent hidden layers (RecurrentLIF)"),
    "ipu-nmnist-recurrent": (ipu.build_nmnist_recurrent, "ipu-nmnist with recurrent hidden layers (RecurrentLIF)"),
    "ipu-dvsgesture-recurrent": (ipu.build_dvsgesture_recurrent,
                                 "ipu-dvsgesture with recurrent hidden layers (RecurrentLIF)"),
    "deep-lif": (deep_lif.build, "8 x (Linear 2048 + LIF), mean readout: the temporal pipeline's benchmark net"),
})
