"""The decisions: what ``advance``, ``receive``, ``relay`` and ``apply_next``
answer, given what a store holds.

No SQL and no database driver here: each function takes a store's unit of
work (:mod:`reliable_flow._store`) and asks it questions and for writes.  The
crash points sit here too, between the writes they separate, so every
engine dies at the same places.
"""

__all__: list[str] = []
