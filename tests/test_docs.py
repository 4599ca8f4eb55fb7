"""Every ```python block of docs/*.md (and README.md) runs, on the CPU.

A page's blocks run in order in one namespace (a later block may use what an earlier one
defined), in a fresh working directory with HOME pointed into it (run directories and the
data cache land there), on one CPU thread, seeded. A block whose first line is a comment
naming what it needs is skipped where that is missing:
    # needs: gpu          a CUDA device (always skipped here: these tests run on the CPU)
    # needs: download     a data set download (always skipped)
    # needs: snntorch     an importable module (peer libraries in docs/migrating.md; under CI,
                          SPIKEFUSE_REQUIRE_PEERS=1, a missing peer fails: tests/peers.py)
Also: docs/api.md is what docs/gen_api.py writes now, and docs/index.md links every page.
"""
from __future__ import annotations

import importlib.util
import linecache
import re
import runpy
import warnings
from pathlib import Path

import pytest
import torch

from peers import is_required

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
ALWAYS_SKIPPED = {"gpu", "download"}
# Pages owned by another work stream whose blocks do not run yet: expected to fail (not
# strictly) until their owner defines what the blocks use or marks them `# needs: ...`.
# Remove the entry once the page passes (pytest reports it as XPASS).
PENDING: dict[str, str] = {}  # page -> why its examples are expected to fail for now

FENCE = re.compile(r"^```(\S*)\s*$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of each ```python block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m and m.group(1):
            start, body, i = i + 1, [], i + 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            if m.group(1) == "python":
                blocks.append((start, "\n".join(body) + "\n"))
        i += 1
    return blocks


def missing_need(code: str) -> str | None:
    """Why the block cannot run here (its first-line `# needs: ...`), or None."""
    first = code.lstrip("\n").splitlines()[0].strip() if code.strip() else ""
    m = re.match(r"#.*needs:\s*([\w., -]+)", first)
    if not m:
        return None
    for need in (n.strip() for n in re.split(r"[ ,]+", m.group(1)) if n.strip()):
        if need in ALWAYS_SKIPPED:
            return need
        if importlib.util.find_spec(need) is None and not is_required(need):
            return f"{need} (not installed)"
    return None


def test_extractor_and_markers():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\n# needs: gpu\nb\n```\n"
    blocks = python_blocks(text)
    assert [code for _, code in blocks] == ["a = 1\n", "# needs: gpu\nb\n"]
    assert missing_need(blocks[0][1]) is None and missing_need(blocks[1][1]) == "gpu"
    assert missing_need("# needs: download\n") == "download"
    assert missing_need("# needs: no_such_module_xyz\n").startswith("no_such_module_xyz")
    assert missing_need("# needs: torch\nimport torch\n") is None


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A scratch cwd and HOME, one thread, fixed seeds, non-interactive plots."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    try:
        yield tmp_path
    finally:
        torch.set_num_threads(threads)


# the extras' modules (all installed in CI)
OPTIONAL = {"nir", "tonic", "matplotlib", "snntorch", "norse", "spikingjelly"}


@pytest.mark.interpreter  # the examples run fused kernels on CPU tensors
@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.xfail(reason=f"{p.name}: {PENDING[p.name]}", strict=False))
    if p.name in PENDING else p for p in PAGES], ids=[p.name for p in PAGES])
def test_page_examples_run(page, sandbox):
    blocks = python_blocks(page.read_text())
    runnable = [(line, code) for line, code in blocks if missing_need(code) is None]
    if not runnable:
        pytest.skip(f"{page.name}: no python block runs here ({len(blocks)} block(s), all marked `# needs:`)")
    namespace = {"__name__": f"docs_{page.stem}"}
    for line, code in runnable:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. the trainer's CaptureFallback on the CPU
                source = f"{page.name}:{line}"
                # the block's source for inspect (Triton reads a kernel's source when it is defined)
                linecache.cache[source] = (len(code), None, code.splitlines(keepends=True), source)
                exec(compile(code, source, "exec"), namespace)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL or is_required(e.name or ""):
                raise
            pytest.skip(f"{page.name}, the python block at line {line}: needs {e.name} (not installed)")
        except Exception as e:
            raise AssertionError(f"{page.name}, the python block at line {line} failed: "
                                 f"{type(e).__name__}: {e}\n--- block ---\n{code}") from e


def test_api_page_is_current():
    generator = runpy.run_path(str(DOCS / "gen_api.py"), run_name="gen_api")
    assert (DOCS / "api.md").read_text() == generator["render"](), \
        "docs/api.md is out of date: run python docs/gen_api.py"


def test_index_links_every_page():
    index = (DOCS / "index.md").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "index.md" and f"({p.name}" not in index]
    assert not missing, f"docs/index.md does not link {missing}"
