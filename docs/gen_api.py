"""Write docs/api.md from the docstrings of spikefuse's public modules.

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date

For each module in MODULES: its names in `__all__` (or, where a module has none, the public
functions and classes defined in it), each with its signature and the first paragraph of its
docstring; for a class also its own public methods that have a docstring. The output depends
only on the source (no addresses, no machine state), so tests/test_docs.py can check that the
committed api.md is current.
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

MODULES = [
    "spikefuse.functional",
    "spikefuse.neuron_options",
    "spikefuse.surrogates",
    "spikefuse.reference",
    "spikefuse.traces",
    "spikefuse.nn",
    "spikefuse.nn.spiking_layers",
    "spikefuse.encode",
    "spikefuse.loss",
    "spikefuse.data",
    "spikefuse.models",
    "spikefuse.compat.snntorch",
    "spikefuse.compat.norse",
    "spikefuse.compat.spikingjelly",
    "spikefuse.compat.spikingjelly.surrogate",
    "spikefuse.train",
    "spikefuse.capture",
    "spikefuse.optim",
    "spikefuse.nir",
    "spikefuse.parallel",
    "spikefuse.precision",
]
SKIPPED_METHODS = {"forward", "extra_repr"}
OUT = Path(__file__).with_name("api.md")


def first_paragraph(obj, block: bool = False) -> str:
    """The docstring's first paragraph on one line; with block=True, a paragraph ending in a
    colon is followed by the next one as an indented (preformatted) block."""
    paras = (inspect.getdoc(obj) or "").strip().split("\n\n")
    text = " ".join(line.strip() for line in paras[0].strip().splitlines())
    if block and text.endswith(":") and len(paras) > 1:
        text += "\n\n" + "\n".join("    " + line for line in paras[1].splitlines())
    return text


def show_default(value) -> str:
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
        return f"{getattr(value, '__module__', '') or ''}.{value.__qualname__}".lstrip(".")
    text = repr(value)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def signature(obj, name: str) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    parts, seen_kw_only = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            seen_kw_only = True
            text = f"*{p.name}"
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}"
        else:
            if p.kind is p.KEYWORD_ONLY and not seen_kw_only:
                parts.append("*")
                seen_kw_only = True
            text = p.name
            if p.default is not p.empty:
                text += f"={show_default(p.default)}"
        if p.kind is p.POSITIONAL_ONLY:
            text += ", /"  # rare; kept simple
        parts.append(text)
    return f"{name}({', '.join(parts)})"


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, obj in vars(module).items()
            if not n.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
            and getattr(obj, "__module__", None) == module.__name__]


def torch_arguments(cls) -> str | None:
    """The public torch class whose arguments `cls` takes unchanged (its __init__ is torch's),
    if any: that signature varies with the torch version, so the page names the class."""
    owner = next(c for c in cls.__mro__ if "__init__" in vars(c))
    if not owner.__module__.startswith("torch."):
        return None
    public = next(c for c in cls.__mro__[1:] if c.__module__.startswith("torch.") and not c.__name__.startswith("_"))
    return f"torch.nn.{public.__name__}" if public.__module__.startswith("torch.nn") else public.__qualname__


def describe(name: str, obj) -> list[str]:
    if inspect.isclass(obj):
        base = torch_arguments(obj)
        heading = f"`{signature(obj, name)}`" if base is None else f"`{name}(...)` (the arguments of `{base}`)"
        lines = [f"### class {heading}", ""]
        text = first_paragraph(obj, block=True)
        if text:
            lines += [text, ""]
        for meth_name, meth in vars(obj).items():
            if meth_name.startswith("_") or meth_name in SKIPPED_METHODS:
                continue
            if isinstance(meth, (staticmethod, classmethod)):
                meth = meth.__func__
            if not inspect.isfunction(meth) or not meth.__doc__:
                continue
            lines.append(f"- `{signature(meth, meth_name).replace('(self, ', '(').replace('(self)', '()')}`: "
                         f"{first_paragraph(meth)}")
        if lines[-1] != "":
            lines.append("")
        return lines
    if callable(obj):
        lines = [f"### `{signature(obj, name)}`", ""]
        text = first_paragraph(obj, block=True)
        return lines + ([text, ""] if text else [])
    text = show_default(obj)
    if len(text) > 100:
        size = f", {len(obj)} entries" if hasattr(obj, "__len__") else ""
        text = f"a {type(obj).__name__}{size}"
    return [f"### `{name}`", "", f"Constant: `{text}`", ""]


# old import paths kept working, each with the module that replaces it
DEPRECATED_ALIASES = {
    "spikefuse.train.capture": "spikefuse.capture",
}


def render() -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings by `python docs/gen_api.py` (do not edit by hand; "
             "`tests/test_docs.py` checks that this page is current). Each entry gives the "
             "signature and the first paragraph of the docstring: the rest of the docstring is in "
             "the source or `help(...)`.", ""]
    for module_name in MODULES:
        lines.append(f"- [`{module_name}`](#{module_name.replace('.', '')})")
    lines.append("")
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## {module_name}", ""]
        text = first_paragraph(module, block=True)
        if text:
            lines += [text, ""]
        for name in public_names(module):
            lines += describe(name, getattr(module, name))
    lines += ["## Deprecated aliases", "",
              "These import paths still work and will be removed in a later release:", ""]
    for old, new in DEPRECATED_ALIASES.items():
        importlib.import_module(old)  # still importable
        lines.append(f"- `{old}`: use `{new}` (the same names)")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
