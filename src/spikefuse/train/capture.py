"""Deprecated alias: the captured step moved to spikefuse.capture (below train, which the
pipeline, the planner and the benchmarks use too). Import it from there; this name goes in a
later release."""
from ..capture import CaptureFallback, CapturedStep, prepare_optimizer

__all__ = ["CapturedStep", "prepare_optimizer", "CaptureFallback"]
