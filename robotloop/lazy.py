"""Packages whose names load on first use (PEP 562): `robotloop.sim` without MuJoCo, `robotloop.loop` without torch,
until a name that needs them is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `package.<where[name]>` when `name` is first read.

    Example:
        ```python
        __getattr__ = lazy_names(__name__, {"AlohaSim": "env"})  # in robotloop/sim/__init__.py
        ```
    """

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's own name
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
