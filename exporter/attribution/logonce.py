"""Log a problem once per attributor rather than once per sample (5 s) forever."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable


class LogOnce:
    """Remembers which keys were logged; `forget` re-arms a key once the problem went away."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[Hashable] = set()

    def warning(self, key: Hashable, message: str, *args: object) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._logger.warning(message, *args)

    def info(self, key: Hashable, message: str, *args: object) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._logger.info(message, *args)

    def forget(self, key: Hashable) -> None:
        self._seen.discard(key)

    def forget_where(self, predicate: Callable[[Hashable], bool]) -> None:
        self._seen = {key for key in self._seen if not predicate(key)}
