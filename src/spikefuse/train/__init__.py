"""Training: the loop (Trainer, fit), atomic checkpoints, JSON-lines metrics, plots,
and the `spikefuse train` / `spikefuse export` commands."""
from .loop import Trainer, fit

__all__ = ["Trainer", "fit"]
