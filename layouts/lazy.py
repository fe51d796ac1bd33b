"""Lazy package exports (PEP 562): a package lists the names it exports and the module each comes from;
the module is imported when a name is first read, so importing the package imports no DSL (``cutlass``
takes seconds to import).  Pure Python."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, namespace: dict, exports: dict[str, str], before=None):
    """``(__getattr__, __dir__)`` for a package's namespace: reading ``name`` in ``exports`` (name ->
    module, relative to ``package``) imports that module, runs ``before(name)`` first when given (e.g.
    to import modules that register something the name needs), binds the attribute in ``namespace``
    (later reads are plain attribute reads) and returns it."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before(name)
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


class LazyModule:
    """A stand-in for a module (or one attribute of a module) that imports it at the first attribute read
    and forwards every read after: a host module can name the DSL (``cute.make_layout`` in a function
    body) without importing it until a compile runs that function.  Only attribute reads and calls are
    forwarded: values read through it are the real ones, the stand-in itself is not (no ``isinstance``
    with it, no passing it on)."""

    __slots__ = ("_path", "_target")

    def __init__(self, module: str, attr: str | None = None):
        object.__setattr__(self, "_path", (module, attr))
        object.__setattr__(self, "_target", None)

    def _resolve(self):
        target = self._target
        if target is None:
            module, attr = self._path
            target = importlib.import_module(module)
            if attr is not None:
                target = getattr(target, attr)
            object.__setattr__(self, "_target", target)
        return target

    def __getattr__(self, name: str):
        return getattr(self._resolve(), name)

    def __call__(self, *args, **kwargs):
        return self._resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        module, attr = self._path
        return f"<lazy {module}{'.' + attr if attr else ''}{' (imported)' if self._target is not None else ''}>"
