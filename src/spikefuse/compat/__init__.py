"""Drop-in modules with a peer library's constructor arguments and semantics, running on
spikefuse's fused kernels: `spikefuse.compat.snntorch` (snnTorch's `Leaky` and `Synaptic`),
`spikefuse.compat.spikingjelly` (SpikingJelly's `LIFNode` and `IFNode`) and
`spikefuse.compat.norse` (Norse's `LIFBoxCell`, `LIFCell`, `IAFCell`, `LIF` and `IAF`).

The layer above spikefuse.nn (docs/architecture.md): the modules here call
spikefuse.functional; a peer library itself is never imported.
"""
