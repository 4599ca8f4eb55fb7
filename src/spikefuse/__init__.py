"""spikefuse: fast, lean training of spiking neural networks on GPUs.

The public modules load on first use (PEP 562), so `import spikefuse` and `spikefuse --help`
do not import torch; `import spikefuse.functional` (or any attribute below) loads it as usual.
"""
import importlib

__version__ = "0.1.0"

_MODULES = ("encode", "functional", "loss", "nn", "reference", "surrogates")
_NAMES = {"NeuronOptions": "neuron_options"}  # name -> the module that defines it
__all__ = [*_MODULES, *_NAMES]


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    try:  # any submodule, as when importing the package imported them all (spikefuse.ops, .models, ...)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise  # the submodule exists but lacks something it imports
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted({*globals(), *__all__})
