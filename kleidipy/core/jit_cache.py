"""numba's on-disk cache keyed by all of kleidipy's sources: a cached kleidipy function is reused only while no
kleidipy source file changed since it was compiled (:func:`install_with_numba`, called by ``import kleidipy``).

Hand-written because numba keys a cached function by its own file's modification time and size alone, while the
compiled code carries every function it calls.

Details: docs/jit-cache.md."""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the kleidipy package directory
PACKAGE = Path(__file__).resolve().parents[1]
_CACHING = "numba.core.caching"


def package_stamp() -> str:
    """A digest of every kleidipy source file's path, modification time and size."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        st = path.stat()
        digest.update(f"{path.relative_to(PACKAGE)}:{st.st_mtime_ns}:{st.st_size};".encode())
    return digest.hexdigest()


def _keyed(base: type, stamp: str) -> type:
    """A subclass of a numba cache locator whose source stamp also holds ``stamp`` for kleidipy's files."""

    class Locator(base):
        def get_source_stamp(self) -> object:
            own = super().get_source_stamp()
            source = getattr(self, "_py_file", None)
            if source is not None and Path(source).resolve().is_relative_to(PACKAGE):
                return (own, stamp)
            return own

    Locator.__name__ = Locator.__qualname__ = f"Kleidipy{base.__name__}"
    return Locator


def install(caching: ModuleType) -> None:
    """Key the cache of kleidipy functions by :func:`package_stamp` in numba's ``caching`` module (idempotent)."""
    classes = caching.CacheImpl._locator_classes
    if any(c.__name__.startswith("Kleidipy") for c in classes):
        return
    stamp = package_stamp()
    classes[:] = [_keyed(c, stamp) for c in classes]
    caching.Cache._save_overload = _guarded(caching.Cache._save_overload)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``numba.core.caching`` as the other finders would and installs the keyed locators right after it
    executes."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != _CACHING:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                execute(module)
                install(module)

            spec.loader.exec_module = exec_module
        return spec


def install_with_numba() -> None:
    """:func:`install` now if numba's caching module is loaded, else as soon as it is."""
    if _CACHING in sys.modules:
        install(sys.modules[_CACHING])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


#: whether this process writes what it compiles to numba's cache (see :func:`pause_saving`)
_saving = True


def pause_saving(paused: bool) -> None:
    """Stop (or resume) writing this process's compiled functions to numba's cache. Used while another process
    builds the compiled plan into the same cache: two processes that add entries of one function to its index at
    once can pair one signature with the other's code (numba picks the data file's name before it writes either)."""
    global _saving
    _saving = not paused


def _guarded(save: object) -> object:
    def _save_overload(self: object, sig: object, data: object) -> None:
        if _saving:
            save(self, sig, data)

    return _save_overload
