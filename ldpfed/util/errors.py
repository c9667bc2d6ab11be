"""Errors raised on bad input: each names the offending field and its value; and the one check of an integer
option, used by every layer that takes one (config, env and engine options, sweep files, the command line)."""

import numbers


class ConfigError(ValueError):
    """A parameter, option or message field has an invalid value."""

    def __init__(self, field: str, value, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}")


def integer(name: str, value, minimum: int = 1) -> int:
    """`value` as an int if it is a whole number >= minimum (an int, a NumPy integer, or a float such as 1e5 with no
    fractional part; never a bool), else ConfigError naming `name`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, numbers.Integral) or float(value).is_integer():
            if value >= minimum:
                return int(value)
    raise ConfigError(name, value, f"must be an integer >= {minimum}")


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
