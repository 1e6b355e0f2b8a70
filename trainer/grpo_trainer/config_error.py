"""The trainer's bad-config error: a leaf module, so that any module may raise it without
importing the config loader (and what the loader imports) above it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad trainer config; ``field`` names the offending dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:
        # Raised in a rank, it reaches the driver pickled inside Ray's RayTaskError; the
        # default (the one formatted arg) cannot rebuild it, and the exit would be 1.
        return ConfigError, (self.field, self.message)
