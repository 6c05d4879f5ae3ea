"""Loading a pipeline's transform from where its user keeps it.

A config names its transform as `module.path:function` (found on the import path, plus the
config's `python_path` folders) or as `path/to/file.py:function` (a file beside the config).
Why not PYTHONPATH: in Dagster it reaches every process, so a `gql.py` in the user's folder
would replace the `gql` package the webserver imports and take it down. So:

- the user's folders are *appended* to this process's `sys.path`, never put first and never
  exported to child processes: an installed module always wins over a user's file of the
  same name, so the folder cannot break anything else this process imports;
- a transform module that has the name of an installed module would therefore never be
  imported itself: it is refused in one line that says to rename it, instead of running
  someone else's code or failing deep inside Spark;
- two pipelines in one process (a Dagster code location serves them all) whose transform
  modules share a name would silently share the first one's module: refused in one line;
- Spark's Python workers, local or on a shared Connect server, never see the folder either:
  every module loaded from the user's folders is registered with Spark's cloudpickle to
  travel by value with the pickled function, so workers need no import path at all.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any

from ledger.core.errors import ConfigError

#: Every user folder appended to `sys.path` in this process: a module found there belongs to
#: a pipeline, not to the installation, and another pipeline must not take it for its own.
_USER_FOLDERS: set[str] = set()


def is_file_spec(spec: str) -> bool:
    """Whether a transform spec names a file (`path/to/file.py:function`)."""
    return spec.rpartition(":")[0].endswith(".py")


def absolute_spec(spec: str, base: Path | None = None) -> str:
    """`spec` with a relative transform file made absolute against `base` (default: the
    current directory). A backfill records its transform in the ledger, and whoever finishes
    the batch after a crash may run from another folder."""
    if not is_file_spec(spec):
        return spec
    file, _, function = spec.rpartition(":")
    return f"{((base or Path.cwd()) / file).resolve()}:{function}"


def load_transform(spec: str, python_path: Sequence[str] = ()) -> Callable[..., Any]:
    """The function `spec` names, imported as the module docstring says; a ConfigError of
    one line for each way it cannot be loaded safely."""
    target, _, func_name = spec.rpartition(":")
    folders = [str(Path(p).resolve()) for p in python_path]
    if is_file_spec(spec):
        file = Path(target).resolve()
        if not file.is_file():
            raise ConfigError(f"transform: no file {file}")
        module_name, where = file.stem, f"{file}"
        folders.insert(0, str(file.parent))
    else:
        module_name, where = target, repr(target)
    top = module_name.partition(".")[0]
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigError(f"transform: {module_name!r} is not a Python module name; rename it")
    module = _import(module_name, top, folders)
    function = getattr(module, func_name, None)
    if not callable(function):
        raise ConfigError(f"transform: {where} has no function {func_name!r}")
    _travel_by_value(folders)
    return function


def _import(module_name: str, top: str, folders: list[str]) -> ModuleType:
    """Import `module_name`, from the user's `folders` when its top-level package is there."""
    user = PathFinder.find_spec(top, folders) if folders else None
    if user is not None:
        _refuse_shadowing(top, user.origin or top, folders)
    for folder in folders:
        _USER_FOLDERS.add(folder)
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"transform: cannot import module {module_name!r}: {exc}") from exc
    if user is not None:
        loaded = sys.modules[top]
        origin = getattr(loaded, "__file__", None) or ""
        if not any(_inside(origin, folder) for folder in folders):
            # another pipeline in this process loaded a module of the same name first
            raise ConfigError(
                f"transform: module {top!r} is already loaded from {origin} by another "
                f"pipeline in this process, so {user.origin} would never be used; rename one"
            )
    return module


def _refuse_shadowing(top: str, found: str, folders: list[str]) -> None:
    """Refuse a user module whose name an installed one (or the standard library) has: with
    the user's folders appended, importing the name gives the installed module."""
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        installed = "Python's standard library"
    else:
        others = [p for p in sys.path if str(Path(p or ".").resolve()) not in folders]
        spec = PathFinder.find_spec(top, others)
        loaded = sys.modules.get(top)
        origin = getattr(loaded, "__file__", None) if loaded is not None else None
        if origin and any(_inside(origin, folder) for folder in folders):
            return  # already imported from the user's folder: this very module
        if spec is None and origin is None:
            return
        installed = (origin or (spec.origin if spec else None)) or top
        if any(_inside(installed, other) for other in _USER_FOLDERS):
            raise ConfigError(
                f"transform: module {top!r} is already loaded from {installed} by another "
                f"pipeline in this process, so {found} would never be used; rename one"
            )
    folder = str(Path(found).parent.parent if found.endswith("__init__.py") else Path(found).parent)
    raise ConfigError(
        f"transform: module {top!r} in {folder} has the name of an installed module "
        f"({installed}); rename it, or importing it would give that module instead"
    )


def _travel_by_value(folders: list[str]) -> None:
    """Register every module loaded from the user's folders with Spark's cloudpickle, so a
    function that Spark ships to its Python workers carries its code along."""
    from pyspark import cloudpickle

    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        if origin and any(_inside(origin, folder) for folder in folders):
            cloudpickle.register_pickle_by_value(module)


def _inside(path: str, folder: str) -> bool:
    return Path(path).resolve().is_relative_to(folder)
