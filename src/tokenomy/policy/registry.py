"""Name -> factory registries for policies.

Policies are chosen by name on command lines and in deployment configs. A registry maps
each name to one factory; registering a name twice or asking for an unknown name fails
loudly, and the error lists the names that do exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """An insertion-ordered map from policy names to factories of kind ``kind``."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name``; a duplicate name raises ValueError."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self._kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        """The object registered as ``name``; ValueError naming the known ones otherwise."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(self._items) or "(none)"
            raise ValueError(f"unknown {self._kind} {name!r}; known: {known}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
