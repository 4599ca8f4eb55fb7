"""The interpreter switch: TRITON_INTERPRET=1, set by the user before the import, is the only
way spikefuse's kernels run on CPU tensors; the package writes no environment variable."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "spikefuse"


def test_no_module_sets_environment_variables():
    """The package reads its environment and writes none of it (TRITON_INTERPRET is the
    user's switch, read once in ops/triton_or_stub.py): no assignment to os.environ, no
    setdefault, update, pop or putenv on it. A child process's own env dict is not covered."""
    writes = re.compile(r"os\.environ(\[[^\]]+\]\s*=(?!=)|\.(setdefault|update|pop|clear)\()|os\.(putenv|unsetenv)\(")
    found = [f"{path.relative_to(SRC.parent.parent)}:{n}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if writes.search(line)]
    assert not found, "\n".join(found)


def test_a_kernel_on_cpu_tensors_without_the_interpreter_is_refused_in_words(tmp_path):
    """Without TRITON_INTERPRET=1, functional's backend="fused" refuses CPU tensors before any
    launch, and a kernel launched on them anyway raises spikefuse's message, not Triton's own
    ("0 active drivers"). In a child process: the switch is read once, at import."""
    pytest.importorskip("triton")
    (tmp_path / "tiny_kernel.py").write_text(
        "import triton\nimport triton.language as tl\n\n"
        "@triton.jit\ndef add_one(p):\n    tl.store(p, tl.load(p) + 1)\n")
    code = ("import torch, tiny_kernel\n"
            "import spikefuse.functional as F\n"
            "from spikefuse.ops.launch import cached_launch\n"
            "x = torch.ones(3, 4)\n"
            "for call in (lambda: F.lif(x, backend='fused'), lambda: cached_launch(tiny_kernel.add_one)[(1,)](x)):\n"
            "    try:\n"
            "        call()\n"
            "    except RuntimeError as e:\n"
            "        print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    assert lines[0].startswith("backend='fused' with a CPU tensor needs Triton's interpreter"), lines[0]
    assert lines[1].startswith("a fused kernel was given CPU tensors"), lines[1]
