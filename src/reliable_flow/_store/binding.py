"""The binding memo of a producer's store object: which consumer names it
has seen bound to which consumer file, so a relay checks the registry in a
write transaction only on its first call for a name (engine-neutral: kept
in the object, never stored)."""

from __future__ import annotations

__all__ = ["BindingMemo"]


class BindingMemo:
    """``known_binding`` / ``remember_binding`` / ``forget_binding`` of
    :class:`~reliable_flow._store.outbox.OutboxStore`, for every engine."""

    _bound: frozenset[tuple[str, str]] = frozenset()

    def known_binding(self, name: str, uid: str) -> bool:
        return (name, uid) in self._bound

    def remember_binding(self, name: str, uid: str) -> None:
        self._bound = self._bound | {(name, uid)}

    def forget_binding(self, name: str) -> None:
        self._bound = frozenset((n, u) for n, u in self._bound if n != name)
