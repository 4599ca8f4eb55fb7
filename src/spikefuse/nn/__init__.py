"""nn.Module wrappers: spiking neurons (and, as they land, time-folded layers)."""
from .neurons import IF, LIF, PLIF, detach_state, reset

__all__ = ["LIF", "IF", "PLIF", "reset", "detach_state"]
from .layers import Dropout, TimeFolded, name_layers, per_step  # noqa: E402
from .batchnorm import TemporalBatchNorm1d, TemporalBatchNorm2d  # noqa: E402
from .bn_lif import BNLIF  # noqa: E402

__all__ += ["TimeFolded", "Dropout", "per_step", "name_layers", "TemporalBatchNorm1d",
            "TemporalBatchNorm2d", "BNLIF"]
from .sparse_linear import SparseSpikingLinear, update_dispatch  # noqa: E402

__all__ += ["SparseSpikingLinear", "update_dispatch"]
from .alif import ALIF  # noqa: E402

__all__ += ["ALIF"]
from .cuba import CUBA  # noqa: E402

__all__ += ["CUBA"]
from .recurrent_lif import RecurrentLIF  # noqa: E402

__all__ += ["RecurrentLIF"]
from .recurrent_alif import RecurrentALIF  # noqa: E402

__all__ += ["RecurrentALIF"]
from .recurrent_cuba import RecurrentCUBA  # noqa: E402

__all__ += ["RecurrentCUBA"]
