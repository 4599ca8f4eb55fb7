"""spikefuse: fast, lean training of spiking neural networks on GPUs."""
__version__ = "0.1.0"

from . import encode, functional, loss, nn, reference, surrogates  # noqa: E402,F401
from .neuron_options import NeuronOptions  # noqa: E402,F401
