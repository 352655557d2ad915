"""The one shape of srdq's four plugin registries: methods, engines, rewards and tasks.

Each registry maps a name to a frozen entry that says what the plugin is (``summary``, one line), what it
needs or provides (capabilities, a reward, an engine, fields) and how to build it (``factory``, which
imports heavy libraries only when called). Looking a name up with ``Registry.entry`` raises one
``ConfigError`` naming the valid choices, the same sentence for every kind. A registry is a ``dict``, so
tests can swap an entry with ``monkeypatch.setitem``.

The entries themselves live beside their plugins (``methods/registry.py``, ``engines/registry.py``,
``rewards/registry.py``, ``tasks/registry.py``); this module imports nothing but the error types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from srd_worker.errors import ConfigError


class _Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...


E = TypeVar("E", bound=_Named)


class Registry(dict[str, E], Generic[E]):
    """``name → entry`` for one kind of plugin (``kind`` is the word error messages use: "method")."""

    def __init__(self, kind: str, entries: Iterable[E], *, sort: bool = True) -> None:
        super().__init__()
        self.kind = kind
        self.sort = sort  # list choices sorted by name, or in registration order
        for entry in entries:
            if entry.name in self:
                raise ValueError(f"{kind} {entry.name!r} is registered twice")
            self[entry.name] = entry

    def choices(self) -> str:
        """The valid names, comma-separated (for help texts and errors)."""
        return ", ".join(self.names())

    def names(self) -> list[str]:
        """The names, sorted (or in registration order when the registry was made with ``sort=False``)."""
        return sorted(self) if self.sort else list(self)

    def entry(self, name: str) -> E:
        """The entry called ``name``; ConfigError naming the valid choices when there is none."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: {self.choices()}") from None

    def summaries(self) -> list[tuple[str, str]]:
        """(name, one-line summary) of every entry, in ``names()`` order."""
        return [(name, self[name].summary) for name in self.names()]


@dataclass(frozen=True)
class Entry:
    """The fields every registry entry has; each registry's entry class adds its factory and needs."""

    name: str
    summary: str
