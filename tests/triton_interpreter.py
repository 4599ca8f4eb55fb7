"""Triton's interpreter, made cheaper for the CPU test run (conftest applies this once).

Under TRITON_INTERPRET=1 every call of a @triton.jit device function (our kernels call the
kernel base's helpers: chunk loaders, surrogates, resets) patches triton.language again, and
each patch walks every member of the language modules with inspect.getmembers. The launch
(or an earlier helper of the same launch) has already patched those modules, and nothing
restores them before the launch ends, so for a helper that sees no module not yet patched the
repeat changes nothing. It was about half of a small LIF
forward and backward's time here (Triton 3.9, cProfile: 6510 `_patch_builtin` calls, 1.8 of
3.8 s). The repeat is skipped in exactly that case; any other call goes to Triton as before,
and where Triton's internals differ from what this expects nothing is changed.
"""
from __future__ import annotations

import inspect


def skip_repeated_language_patches() -> bool:
    """Install the shortcut; False (and nothing changed) where this Triton lacks the hooks."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang, empty_scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if patch_lang is None or empty_scope is None or getattr(patch_lang, "skips_repeats", False):
        return False
    patched: list[frozenset] = []  # the language modules the running launch patched (at most one entry)

    def languages(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def patch_once(fn):
        seen = languages(fn)
        if patched and seen <= patched[0]:
            return empty_scope()  # a helper inside the launch: its modules are patched already
        scope = patch_lang(fn)
        if patched:  # a helper seeing other modules: Triton never restores its patches, so they hold too
            patched[0] |= seen
        else:  # the launch itself: remember its modules until it restores them
            patched.append(seen)
            restore = scope.restore

            def restore_and_forget():
                try:
                    restore()
                finally:
                    patched.clear()
            scope.restore = restore_and_forget
        return scope

    patch_once.skips_repeats = True
    interpreter._patch_lang = patch_once
    return True
