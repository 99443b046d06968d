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

from typing import Callable, Generic, Iterator, TypeVar

from marius_py.errors import MariusInputError

Plugin = TypeVar("Plugin")


class Registry(Generic[Plugin]):
    """Plug-ins of one kind by name. ``check(name, plugin)`` refuses an unfit plug-in when it is registered
    (``MariusInputError`` naming what it lacks); ``entries``: an existing mapping to keep registering into
    (the orderings' own table); ``home``: where the registry is reached from, as errors name it."""

    def __init__(self, kind: str, home: str, check: Callable[[str, Plugin], None] | None = None,
                 entries: dict[str, Plugin] | None = None):
        self.kind = kind
        self.home = home
        self._check = check
        self._entries: dict[str, Plugin] = entries if entries is not None else {}
        self._origins: dict[str, str] = {}

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
            origin = self._origins.get(name, "the engine")
            raise MariusInputError(f"{self.kind} {name!r} is already registered (by {origin})",
                                   expected="another name, or register(..., replace=True) to replace it")
        if self._check is not None:
            self._check(name, plugin)
        self._entries[name] = plugin
        self._origins[name] = getattr(plugin, "__module__", None) or "?"
        return plugin

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._origins.pop(name, None)

    def get(self, name: str, setting: str | None = None) -> Plugin:
        """The plug-in ``name``; an unknown one is one error listing the registered names (``setting``: the
        config key that named it, as the error says)."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.unknown(name, setting) from None

    def unknown(self, name, setting: str | None = None) -> MariusInputError:
        where = f"{setting}: " if setting else ""
        return MariusInputError(f"{where}unknown {self.kind} {name!r}",
                                expected=f"one of {', '.join(self.names())}; a plug-in is registered with "
                                         f"{self.home}.register(name, ...) by the code that uses it, before the "
                                         "config is read")

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, Plugin]]:
        return iter(list(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
