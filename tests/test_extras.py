"""Optional dependencies: the core imports without them, and a missing one is named with
the pip extra that installs it."""
import os
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


def test_core_runs_without_triton(tmp_path):
    """A CPU-only core install has no Triton: the package imports, the models run forward and
    backward on their pure-PyTorch paths, and `spikefuse train` trains."""
    code = ("import sys\n"
            "sys.modules['triton'] = None\n"
            "import torch\n"
            "from spikefuse.models import build_model\n"
            "m = build_model('ipu-shd', (700,), 20, 4, width=1 / 64)\n"
            "m((torch.rand(3, 2, 700) < 0.1).float()).sum().backward()\n"
            "m = build_model('cifar-small', (3, 32, 32), 10, 2)\n"
            "m(torch.rand(2, 3, 32, 32)).sum().backward()\n"
            "from spikefuse.cli import main\n"
            f"sys.exit(main(['train', '--epochs', '1', '--quiet', '--out', {str(tmp_path / 'run')!r}]))\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TRITON_INTERPRET": "0"})


def test_a_kernel_without_triton_says_how_to_get_it():
    code = ("import sys\n"
            "sys.modules['triton'] = None\n"
            "import torch\n"
            "from spikefuse.functional import lif\n"
            "try:\n"
            "    lif(torch.rand(3, 4), backend='fused')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "Triton" in out, out
