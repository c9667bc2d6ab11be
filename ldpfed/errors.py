"""Errors raised on bad input: each names the offending field and its value."""


class ConfigError(ValueError):
    """A parameter, option or message field has an invalid value."""

    def __init__(self, field: str, value, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}")
