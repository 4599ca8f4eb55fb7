"""Optional dependencies: the core imports without them, and a missing one is named with
the pip extra that installs it."""
import subprocess
import sys

import pytest

from spikefuse.errors import require


def test_require_names_the_extra():
    with pytest.raises(ImportError, match=r"the SHD data set needs tonic.*spikefuse\[data\]"):
        raise_missing("tonic", "the SHD data set")


def raise_missing(top, feature):
    """require() for a package made unimportable in this process."""
    saved = sys.modules.get(top)
    sys.modules[top] = None  # an import of it now fails
    try:
        require(top, feature)
    finally:
        if saved is None:
            del sys.modules[top]
        else:
            sys.modules[top] = saved


def test_require_returns_the_module():
    assert require("json", "a test").dumps([1]) == "[1]"


def test_core_imports_without_the_extras():
    """spikefuse, its nn/functional/models/train and the digits data import with tonic,
    matplotlib and nir blocked."""
    code = ("import sys\n"
            "for m in ('tonic', 'matplotlib', 'nir', 'sklearn'): sys.modules[m] = None\n"
            "import spikefuse, spikefuse.nn, spikefuse.functional, spikefuse.models, spikefuse.train\n"
            "from spikefuse.data import load\n"
            "load('digits')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
