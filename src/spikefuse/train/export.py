"""`spikefuse export --nir RUN_DIR`: a trained run as a NIR graph (nir.write, HDF5).

The conversion lives in spikefuse.nir (to_nir / from_nir; conventions in its docstring and
docs/nir.md); this module is the command. Defaults: dt = 1e-4 s per step (snnTorch's fixed
value; Norse takes it as from_nir(graph, dt=...)), --form peers (r = 1, neuron input gains
folded into the weights: loads in snnTorch and Norse), --readout affine (a mean-over-time
readout written as its Affine; --readout integrator adds NIR's I, which the peers cannot build).
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..errors import UsageError, one_line, require
from ..nir import DEFAULT_DT, FORMS, READOUT_NODES, to_nir
from .config import ConfigError, check_path_name

__all__ = ["to_nir", "DEFAULT_DT", "configure", "run"]


# ---- the subcommand ----

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nir", metavar="RUN_DIR", required=True, help="run directory written by `spikefuse train`")
    parser.add_argument("--out", metavar="FILE", help="output file (default: RUN_DIR/model.nir)")
    parser.add_argument("--dt", type=float, default=DEFAULT_DT, help=f"seconds per time step (default: {DEFAULT_DT}, "
                        "the value snnTorch's importer assumes)")
    parser.add_argument("--form", choices=FORMS, default="peers",
                        help="peers: r = 1, gains folded into the weights (snnTorch and Norse load it); "
                             "nir: weights verbatim, r = 1/(1 - decay) (default: peers)")
    parser.add_argument("--readout", choices=READOUT_NODES, default="affine",
                        help="how a mean-over-time readout is written: its Affine (the graph outputs the "
                             "per-step drive; average it over T) or Affine + NIR integrator I (default: affine)")


def run(args: argparse.Namespace) -> int:
    try:
        nir = require("nir", "spikefuse export --nir")
    except ImportError as e:  # the extra is missing: say which one, in one line
        raise UsageError(str(e)) from None

    from . import checkpoint
    from ..models import MODELS, build_model

    try:  # '' read as the current directory (--nir) or as the default file (--out), without a word
        check_path_name("--nir", args.nir, "pass a run directory written by `spikefuse train`", "a run directory")
        check_path_name("--out", args.out, "leave --out out for the default RUN_DIR/model.nir", "a file")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    run_dir = Path(args.nir)
    path = run_dir / checkpoint.FILENAME
    if not path.is_file():
        raise UsageError(f"{run_dir} has no {checkpoint.FILENAME}; pass a run directory written by `spikefuse train`")
    if not 0 < args.dt < math.inf:  # also refuses nan
        raise UsageError(f"--dt must be a finite number of seconds > 0, got {args.dt}")
    try:
        state = checkpoint.load(path)
    except checkpoint.CheckpointError as e:
        raise UsageError(str(e)) from None
    config = state.get("config")
    spec = config.get("model") if isinstance(config, dict) else None
    if not isinstance(spec, dict) or "model" not in state:
        raise UsageError(f"{path} does not say which model it holds (config['model'] or the weights are "
                         "missing); export runs written by `spikefuse train`, or call spikefuse.nir.to_nir")
    if spec.get("name") not in MODELS:
        raise UsageError(f"the run's model {spec.get('name')!r} is not known here; known: {', '.join(MODELS)}")
    try:
        model = build_model(spec["name"], spec["input_shape"], spec["num_classes"], spec["time_steps"],
                            **spec.get("kwargs", {}))
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # a damaged or edited checkpoint
        raise UsageError(f"{path}: its weights do not fit the model its config describes ({one_line(e)})") from None
    try:
        model.eval()  # BatchNorm folds with its running statistics
        graph = to_nir(model, spec["input_shape"], spec["time_steps"], dt=args.dt, form=args.form,
                       readout=args.readout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out) if args.out is not None else run_dir / "model.nir"
    out = _check_writable(out, nir)
    tmp = out.with_name(f".{out.name}.tmp")  # same folder: the rename below is atomic
    try:
        nir.write(tmp, graph)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {out}: {len(graph.nodes)} NIR nodes ({', '.join(type(n).__name__ for n in graph.nodes.values())}), "
          f"dt = {args.dt} s per step, form {args.form}, readout {graph.metadata['readout']}"
          + (f" ({graph.metadata['readout_node']})" if graph.metadata["readout"] == "mean" else ""))
    return 0


def _check_writable(out: Path, nir) -> Path:
    """The file to write: export writes a new file or replaces a NIR graph (an earlier export),
    never another file, such as the run's checkpoint. A symbolic link is written through (the
    rename would have replaced the link itself with a file); one that leads nowhere is refused."""
    if out.is_symlink():
        try:
            out = Path(os.path.realpath(out, strict=True))
        except OSError as e:  # a loop, or a link to a missing file
            raise UsageError(f"--out {out} is a symbolic link that cannot be followed "
                             f"({e.strerror or 'it leads nowhere'}); pass a file name") from None
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; pass a file name (default: RUN_DIR/model.nir)")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist")
    if out.exists():
        try:
            nir.read(out)
        except Exception:  # noqa: BLE001  (any file NIR cannot read is one export did not write)
            raise UsageError(f"--out {out} exists and is not a NIR graph; export replaces only its own "
                             "files: choose another --out") from None
    return out
