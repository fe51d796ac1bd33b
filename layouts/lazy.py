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
