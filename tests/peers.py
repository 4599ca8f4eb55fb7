"""Importing a peer library (snnTorch, Norse, SpikingJelly, and NIR, which their conformance
tests exchange models through) in a test: skipped where it is missing, a failure under CI.

.ci/run exports SPIKEFUSE_REQUIRE_PEERS=1: the test extra installs every peer there, so one
that did not install must fail the run, not quietly skip the tests that compare against it.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import warnings

import pytest
import torch

REQUIRED = os.environ.get("SPIKEFUSE_REQUIRE_PEERS") == "1"
PEERS = ("snntorch", "norse", "spikingjelly", "nir")  # the test extra's peers (docs' `# needs:` names)


def require(name: str):
    """The module `name` (e.g. "snntorch", "norse.torch"): pytest.importorskip(name), except
    under SPIKEFUSE_REQUIRE_PEERS=1, where a missing module is an error naming the variable."""
    if not REQUIRED:
        return pytest.importorskip(name)
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"{name} is missing: SPIKEFUSE_REQUIRE_PEERS=1 (CI) requires the peers of the test "
                          f"extra ({e})") from e


def is_required(name: str) -> bool:
    """Whether a missing `name` fails here rather than skips (a peer, under CI)."""
    return REQUIRED and name.split(".")[0] in PEERS


@pytest.fixture
def quiet():
    """The peers' prints, warnings and log lines (snnTorch's importer prints as it goes)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        yield
        logging.disable(logging.NOTSET)


def stepped(module, x):
    """A module of the peers' calling style, out, state = module(x[t], state), over x [T, ...]
    from a fresh state: Norse's SequentialState and the nirtorch graphs both peers import to
    (a recurrent graph's loop lives in that state)."""
    state, outs = None, []
    with torch.no_grad():
        for step in x:
            out, state = module(step, state)
            outs.append(out)
    return torch.stack(outs)
