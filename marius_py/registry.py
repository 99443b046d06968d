"""One registry mechanism for every extension point (decoders, losses, regularisers, negative samplers,
orderings, callbacks, and later encoders), as PyTorch-BigGraph's ``PluginRegistry`` and PyKEEN's resolvers:
research code registers a plug-in by name from its own module, a config names it, and an unknown name is one
error listing the registered ones.

    from marius_py.models import DECODERS

    @DECODERS.register("simple")
    class SimplE(Decoder): ...

    DECODERS.register("my_loss", my_loss_function)     # as a function, too

Registries are live: validation and the plan ask them (and the plug-in's declared capabilities) when they
run, never a list frozen at import. A config names the plug-ins a run uses; a process that has not registered
one is told which, the names it has, and how to register it (``Registry.unknown``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import reprlib
import sys
import weakref
from pathlib import Path
from types import ModuleType
from typing import Callable, Generic, Iterator, TypeVar

from marius_py.errors import MariusInputError

Plugin = TypeVar("Plugin")

# Every registry, so that a plug-in module whose import fails leaves none of its registrations behind.
_REGISTRIES: "weakref.WeakSet[Registry]" = weakref.WeakSet()


class Registry(Generic[Plugin]):
    """Plug-ins of one kind by name. ``check(name, plugin)`` refuses an unfit plug-in when it is registered
    (``MariusInputError`` naming what it lacks); ``entries``: an existing mapping to keep registering into
    (the orderings' own table); ``home``: where the registry is reached from, as errors name it."""

    def __init__(self, kind: str, home: str, check: Callable[[str, Plugin], None] | None = None,
                 entries: dict[str, Plugin] | None = None, loaded_by: str | None = None):
        """``loaded_by``: the config key naming modules that register plug-ins, as an unknown name's error
        suggests it."""
        self.kind = kind
        self.home = home
        self._check = check
        self._entries: dict[str, Plugin] = entries if entries is not None else {}
        self._origins: dict[str, str] = {}
        self._loaded_by = loaded_by
        _REGISTRIES.add(self)

    def register(self, name: str, plugin: Plugin | None = None, *, replace: bool = False):
        """Register ``plugin`` under ``name``; without ``plugin``, a decorator that registers what it decorates.
        A name registered already is refused unless ``replace``."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise MariusInputError(f"{self.kind} name {name!r}", expected="a non-empty name without surrounding "
                                                                         "spaces")
        if plugin is None:
            def decorate(target: Plugin) -> Plugin:
                self.register(name, target, replace=replace)
                return target
            return decorate
        if name in self._entries and not replace and self._entries[name] is not plugin:
            raise MariusInputError(f"{self.kind} {name!r} is already registered (by {self.origin(name)})",
                                   expected="another name, or register(..., replace=True) to replace it")
        if self._check is not None:
            self._check(name, plugin)
        self._entries[name] = plugin
        self._origins[name] = getattr(plugin, "__module__", None) or "?"
        return plugin

    @contextlib.contextmanager
    def registered(self, name: str, plugin: Plugin):
        """``plugin`` registered under ``name`` for the block only (tests, a notebook's experiment)."""
        self.register(name, plugin)
        try:
            yield plugin
        finally:
            self.unregister(name)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._origins.pop(name, None)

    def get(self, name: str, setting: str | None = None, path: object = None, line: int | None = None) -> Plugin:
        """The plug-in ``name``; an unknown one is one error listing the registered names (``setting``: the
        config key that named it, ``path`` and ``line``: where, as the error says)."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.unknown(name, setting, path, line) from None

    def unknown(self, name, setting: str | None = None, path: object = None,
                line: int | None = None) -> MariusInputError:
        where = f"{setting}: " if setting else ""
        return MariusInputError(f"{where}unknown {self.kind} {name!r}", path=path, line=line,
                                expected=self.choices())

    def choices(self) -> str:
        """The registered names, and how a plug-in joins them (what an unknown name's error expects)."""
        loaded = f", or by a module the config names in {self._loaded_by}" if self._loaded_by else ""
        return (f"one of {', '.join(self.names())}; a plug-in is registered with {self.home}.register(name, ...) "
                f"by the code that uses it, before the config is read{loaded}")

    def origin(self, name: str) -> str:
        """Where plug-in ``name`` was registered from: its module, or "the engine" for the built-in ones."""
        module = self._origins.get(name)
        return "the engine" if module is None or module.split(".")[0] == "marius_py" else module

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, Plugin]]:
        return iter(list(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # (unhashable: a config value set in code)
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def where_defined(plugin) -> str:
    """A plug-in's module and name, as errors about it say where it comes from."""
    return f"{getattr(plugin, '__module__', '?')}.{getattr(plugin, '__qualname__', type(plugin).__name__)}"


def check_function(kind: str, name: str, plugin, parameters: tuple[str, ...], probe: tuple,
                   fits: Callable[[object], bool], returns: str) -> None:
    """Refuse a function plug-in that does not take ``parameters`` (positionally), or whose result on ``probe``
    (arguments of those parameters, small) does not fit (``returns`` says what should come back)."""
    what = f"{kind} {name!r} ({where_defined(plugin)})"
    signature = f"({', '.join(parameters)})"
    if not callable(plugin):
        raise MariusInputError(f"{what} is not callable", expected=f"a function of {signature}")
    try:
        inspect.signature(plugin).bind(*parameters)
    except TypeError:
        raise MariusInputError(f"{what} does not take {signature}",
                               expected=f"a function of {signature} returning {returns}") from None
    except ValueError:
        pass  # (no signature to read: a builtin; the probe tells)
    try:
        result = plugin(*probe)
    except Exception as error:  # (user code: whatever it raises is the plug-in's fault)
        raise MariusInputError(f"{what} failed on a small probe: {type(error).__name__}: {error}",
                               expected=f"a function of {signature} returning {returns}") from None
    if not fits(result):
        raise MariusInputError(f"{what} returned {_describe(result)} on a small probe", expected=returns)


def _describe(value) -> str:
    """What a probe returned, briefly: tensors by dtype and shape, tuples item by item."""
    if isinstance(value, tuple):
        return f"({', '.join(_describe(item) for item in value)})"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {str(getattr(value, 'dtype', '')).replace('torch.', '')} tensor of shape {tuple(shape)}"
    return "None" if value is None else f"{type(value).__name__} {reprlib.repr(value)}"


# ---- modules that register plug-ins, named by a config (model.plugins) ----

def plugin_modules(spec: str) -> list[str]:
    """The module names and .py paths of a comma-separated ``model.plugins``."""
    return [item.strip() for item in spec.split(",") if item.strip()]


def import_plugins(spec: str, setting: str = "model.plugins", path: object = None,
                   line: int | None = None) -> list[ModuleType]:
    """Import each module of ``spec`` (comma-separated module names or .py paths; a module imported already is
    not run again), so that the plug-ins it registers are known. A module that is missing or fails is one
    error naming it (``setting``, ``path``, ``line``: where it was given), and leaves none of its
    registrations behind."""
    return [_import_plugin(item, setting, path, line) for item in plugin_modules(spec)]


def _import_plugin(item: str, setting: str, path: object, line: int | None) -> ModuleType:
    failure = f"{setting}: plug-in module {item!r}"
    expected = "a module importable here (on sys.path or in the current directory) or a .py file's path"
    by_path = item.endswith(".py") or os.sep in item or "/" in item
    if by_path and not Path(item).expanduser().is_file():
        raise MariusInputError(f"{failure} not found", path=path, line=line, expected=expected)
    saved = [(registry, dict(registry._entries), dict(registry._origins)) for registry in list(_REGISTRIES)]
    try:
        return _module_from_path(Path(item).expanduser().resolve()) if by_path else _module_by_name(item)
    except Exception as error:  # (user code: whatever it raises, it is named and nothing it registered stays)
        _restore(saved)
        missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
        if missing is not None and (item == missing or item.startswith(missing + ".")):
            raise MariusInputError(f"{failure} not found", path=path, line=line, expected=expected) from None
        raise MariusInputError(f"{failure} failed to import: {type(error).__name__}: {error}", path=path,
                               line=line, expected="a module that imports without error") from None


def _module_by_name(name: str) -> ModuleType:
    """``import name``, also from the current directory (as ``python -m`` finds modules; the console script's
    own directory is on sys.path instead)."""
    if name in sys.modules or "" in sys.path or os.getcwd() in sys.path:
        return importlib.import_module(name)
    sys.path.append(os.getcwd())
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(os.getcwd())


def _module_from_path(file: Path) -> ModuleType:
    """The module of a .py file, named by its stem (another module of that name: by the stem and a digest of
    the path), run once per process."""
    name = file.stem
    existing = sys.modules.get(name)
    if existing is not None and _is_file(existing, file):
        return existing
    if existing is not None:
        name = f"{name}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _is_file(module: ModuleType, file: Path) -> bool:
    location = getattr(module, "__file__", None)
    return location is not None and Path(location).resolve() == file


def _restore(saved) -> None:
    """Put every registry back as it was before a failed import."""
    for registry, entries, origins in saved:
        registry._entries.clear()
        registry._entries.update(entries)
        registry._origins.clear()
        registry._origins.update(origins)
