"""Errors raised on bad input: each names the offending field and its value."""


class ConfigError(ValueError):
    """A parameter, option or message field has an invalid value."""

    def __init__(self, field: str, value, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}")


def describe_error(error: BaseException) -> str:
    """One line for a failure record: the error's type, its message, and for Ray errors the actor, process and
    node it concerns (Ray puts them on later lines of its message: class_name, actor_id, pid, ip)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    message = lines[0] if lines else ""
    where = [line for line in lines[1:] if line.split(":", 1)[0] in ("class_name", "actor_id", "pid", "ip", "node_id")]
    for attr in ("actor_id", "node_ip_address", "pid"):
        value = getattr(error, attr, None)
        if value and not any(line.startswith(attr) for line in where):
            where.append(f"{attr}: {value}")
    return f"{type(error).__name__}: {message}" + (f" ({'; '.join(where)})" if where else "")
