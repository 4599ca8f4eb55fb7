"""nn.Module wrappers: spiking neurons (and, as they land, time-folded layers)."""
from .neurons import IF, LIF, PLIF

__all__ = ["LIF", "IF", "PLIF"]
