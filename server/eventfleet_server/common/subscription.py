"""Event-type subscriptions with hat-event 0.9 semantics.

``'?'`` matches exactly one segment at any position; ``'*'`` matches zero or more
segments and is valid only as the last segment. Matching walks a trie, so its cost
depends on the type's length, not on the number of subscribed patterns.
"""

from __future__ import annotations

from collections.abc import Iterable

from eventfleet_server.common.model import EventType

_END = object()  # marks "a pattern ends here" in the trie
# Types remembered per subscription (`Subscription.matches`); cleared when full, so a
# stream of ever-new types costs a trie walk each, as without the memo.
_MEMO_MAX = 1024


class InvalidSubscriptionError(ValueError):
    """A pattern is not a valid subscription (the message names it)."""


def validate_pattern(pattern: Iterable[str]) -> EventType:
    pattern = tuple(pattern)
    for i, segment in enumerate(pattern):
        if not isinstance(segment, str):
            raise InvalidSubscriptionError(f"subscription {pattern!r}: segment {i} is not a string")
        if segment == "*" and i != len(pattern) - 1:
            raise InvalidSubscriptionError(
                f"subscription {list(pattern)!r}: '*' is only valid as the last segment"
            )
    return pattern


class Subscription:
    """An immutable set of event-type patterns."""

    __slots__ = ("_all", "_memo", "_patterns", "_tree")

    def __init__(self, patterns: Iterable[Iterable[str]]):
        self._patterns = tuple(dict.fromkeys(validate_pattern(p) for p in patterns))
        self._tree: dict = {}
        for pattern in self._patterns:
            node = self._tree
            for segment in pattern:
                node = node.setdefault(segment, {})
            node[_END] = True
        self._all = ("*",) in self._patterns
        self._memo: dict[EventType, bool] = {}

    @property
    def patterns(self) -> tuple[EventType, ...]:
        return self._patterns

    @property
    def matches_all(self) -> bool:
        return self._all

    @property
    def is_empty(self) -> bool:
        return not self._patterns

    def matches(self, event_type: EventType) -> bool:
        # Every committed event is matched against every session's subscription, twice
        # (persisted or not); deployments register a bounded set of types, so the
        # answer is remembered per type (a dict lookup instead of a trie walk).
        if self._all:
            return True
        memo = self._memo
        found = memo.get(event_type)
        if found is None:
            found = _match(self._tree, event_type, 0)
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[event_type] = found
        return found

    def __repr__(self) -> str:
        return f"Subscription({[list(p) for p in self._patterns]!r})"


def _match(node: dict, event_type: EventType, i: int) -> bool:
    if "*" in node:
        return True
    if i == len(event_type):
        return _END in node
    child = node.get(event_type[i])
    if child is not None and _match(child, event_type, i + 1):
        return True
    child = node.get("?")
    return child is not None and _match(child, event_type, i + 1)
