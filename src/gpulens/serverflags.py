"""Conventions both servers share (the exporter and `gpulens remediate`): flag values and errors.

Both take exporter-toolkit's flags (`--web.listen-address`, `--web.config.file`,
`--web.telemetry-path`, `--log.level`, `--log.format`), so the values mean the same on both:

- a listen address is `HOST:PORT`, `[V6]:PORT` or `:PORT` (every address, as Go's net.Listen);
- a duration is a number of seconds with an optional unit: `90`, `90s`, `30m`, `1h`, `1d`;
- log levels are debug, info, warn (`warning` accepted too), error; formats logfmt and json.

`ConfigError` is the one error type for a bad flag, variable or file: `str()` is one line naming it.
"""

from __future__ import annotations

import re

LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
LOG_FORMATS = ("logfmt", "json")
LOG_FORMAT_ALIASES = {"text": "logfmt"}  # the name before logfmt, still accepted
DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d{1,12}(?:\.\d{1,9})?)([smhd]?)")


class ConfigError(ValueError):
    """A bad flag, variable or file; `str()` is one line naming it.

    Control characters are escaped here, once for every message: a value quoted into the message
    (a path, an unparsed argument) can carry a newline, which must not split or forge log lines.
    """

    def __str__(self) -> str:
        text = super().__str__()
        if text.isprintable():
            return text
        return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def parse_listen(value: str, flag: str = "--web.listen-address") -> tuple[str, int]:
    """':9842' -> ('', 9842); '127.0.0.1:1' -> ('127.0.0.1', 1); '[::1]:9842' -> ('::1', 9842).

    An empty host means every address (the server binds dual-stack where it can).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ConfigError(f"{flag}: expected [HOST]:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{flag}: port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag}: port must be 0..65535, got {port}")
    return host, port


def parse_duration(text: str, flag: str = "duration") -> float:
    """`90`, `90s`, `30m`, `1h`, `1d` -> seconds (the digits are bounded: no absurd numbers)."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"{flag}: expected a duration such as 90s, 30m or 1h, got {text!r}")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


def log_level(name: str, flag: str = "--log.level") -> str:
    """The `logging` level name of a `--log.level` value (`warn` and `warning` alike)."""
    if name not in LOG_LEVELS:
        raise ConfigError(f"{flag}: expected one of {', '.join(LOG_LEVELS)}, got {name!r}")
    return "WARNING" if name in ("warn", "warning") else name.upper()


def log_format(name: str, flag: str = "--log.format") -> str:
    """logfmt or json (`text`, the earlier name of logfmt, accepted)."""
    name = LOG_FORMAT_ALIASES.get(name, name)
    if name not in LOG_FORMATS:
        raise ConfigError(f"{flag}: expected logfmt or json, got {name!r}")
    return name
