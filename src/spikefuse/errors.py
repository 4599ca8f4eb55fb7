"""Errors the command line turns into one line: UsageError exits 2, RunError exits 1."""


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2, no traceback."""


class RunError(Exception):
    """A fault while running (the run directory is busy, training diverged): one line, exit code 1."""


EXTRAS = {"tonic": "data", "matplotlib": "plot", "nir": "nir"}  # optional package -> pip extra


def require(module: str, feature: str):
    """Import an optional package, or raise ImportError naming the extra that installs it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise ImportError(f"{feature} needs {top}, an optional dependency: pip install "
                          f"'spikefuse[{EXTRAS.get(top, 'all')}]'") from e


def one_line(e: BaseException) -> str:
    """`Type: first non-empty line of the message` (some errors, e.g. EOFError, have none);
    a first line that only introduces the next ("Error(s) in loading state_dict for X:") takes it along."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    text = f"{lines[0]} {lines[1]}" if len(lines) > 1 and lines[0].endswith(":") else lines[0]
    return f"{type(e).__name__}: {text}"
