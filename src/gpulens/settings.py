"""Settings declared once: a config dataclass field carries its flag, aliases, help and check.

A server's configuration is a frozen dataclass whose fields name, in their metadata, the flag that
sets them (`setting(...)`). From that one declaration come the argparse options, the `GPULENS_*`
environment fallback (the flag's name upper-cased, dots and dashes as underscores), the one-line
error for a value that does not parse or is out of range, the warning for an alias kept from an
earlier release, and the flag table in the docs (`markdown_table`). `analyzer/thresholds.py`
declares its thresholds the same way.

Precedence: the flag, then its aliases on the command line, then the flag's variable, then the
aliases' variables, then the field's default.

The options record the names they were given as on the namespace (`USED`), so `resolve` can tell
an alias from the flag without the command line: a subcommand's module gets only the namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpulens.serverflags import ConfigError

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})
KEY = "gpulens.setting"  # the field metadata key
USED = "settings_used"  # the namespace attribute: option strings typed (`_Given`)
Number = TypeVar("Number", int, float)  # a bound's type is its flag's: `at_least`


@dataclass(frozen=True)
class Setting:
    """How one config field is set from the command line and the environment.

    `parse` turns the flag's text into the field's value (ValueError/TypeError: not that kind of
    value, reported as `expected`); `check` returns what is wrong with a parsed value (the text
    after "FLAG: "), or None. A setting without `metavar` is a switch (`--flag` sets True, or
    False with `negated`).
    """

    flag: str
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] = str
    expected: str = "a value"
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    negated: bool = False  # a switch that turns the field off (`--no-attribution.procfs`)
    value_aliases: tuple[tuple[str, str], ...] = ()  # (earlier value, its name now): deprecated
    default_doc: str | None = None  # the docs' default column when the field's default says less
    deprecated: str = ""  # the setting itself is on its way out: what replaces it (warned when used)
    group: str = ""  # the --help section it is listed under

    @property
    def env(self) -> str:
        return env_name(self.flag)

    @property
    def switch(self) -> bool:
        return self.metavar is None


def existing_file(value: Path | None) -> str | None:
    """A `check` for a file flag: unset, or a file that exists."""
    return None if value is None or value.is_file() else f"{value} does not exist"


def existing_directory(value: Path | None) -> str | None:
    """A `check` for a directory flag: unset, or a directory that exists."""
    return None if value is None or value.is_dir() else f"{value} is not a directory"


def at_least(
    low: Number, note: str = "", *, wording: str = "expected at least"
) -> Callable[[Number], str | None]:
    """A `check` for a number flag: `low` or more. `note` says what the bound means
    (`" (0: no limit)"`); `wording` keeps each server's phrasing (the exporter's "must be >=")."""

    def problem(value: Number) -> str | None:
        return None if value >= low else f"{wording} {_number(low)}{note}, got {_number(value)}"

    return problem


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def http_url(what: str = "") -> Callable[[str | None], str | None]:
    """A `check` for a URL flag: unset or empty, or an http(s) URL with a host and no control
    characters (they would split the request line); `what` names the server (" of the API server")."""

    def problem(value: str | None) -> str | None:
        if not value:
            return None
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or not value.isprintable():
            return f"expected an http:// or https:// URL{what}, got {value!r}"
        return None

    return problem


def telemetry_path(reserved: Collection[str], served: str) -> Callable[[str], str | None]:
    """A `check` for `--web.telemetry-path`: an absolute URL path of printable characters that no
    other endpoint of the server uses (`reserved`; `served` says by what, in the error)."""

    def problem(path: str) -> str | None:
        if not path.startswith("/") or not path.isprintable() or any(c in path for c in " ?#"):
            return f"expected an absolute URL path like /metrics, got {path!r}"
        if path in reserved:
            return f"{path} is already served {served}"
        return None

    return problem


def setting(**kwargs: Any) -> dict[str, Setting]:
    """Field metadata declaring a setting: `field(default=..., metadata=setting(flag=..., ...))`."""
    return {KEY: Setting(**kwargs)}


def env_name(flag: str) -> str:
    """`--web.listen-address` -> `GPULENS_WEB_LISTEN_ADDRESS`."""
    return "GPULENS_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(raw)


def settings_of(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """The fields of dataclass `cls` that declare a setting, in declaration order."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(KEY)
        if isinstance(spec, Setting):
            yield f, spec


def aliases_of(cls: type) -> dict[str, str]:
    """Every alias -> its setting's flag."""
    return {alias: spec.flag for _, spec in settings_of(cls) for alias in spec.aliases}


class _Given(argparse.Action):
    """Stores the option's text (True for a switch) and notes the name it was given as (`USED`)."""

    def __init__(self, option_strings: list[str], dest: str, switch: bool = False, **kwargs: Any) -> None:
        self.switch = switch
        super().__init__(option_strings, dest, nargs=0 if switch else None, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True if self.switch else values)
        if option_string:
            setattr(namespace, USED, frozenset({*getattr(namespace, USED, ()), option_string}))


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One option per setting (its aliases as extra option strings), under its `group`'s heading;
    values stay text until `resolve`, so a bad value gets our one-line error rather than argparse's."""
    groups: dict[str, Any] = {"": parser}
    for f, spec in settings_of(cls):
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group)
        names = (spec.flag, *spec.aliases)
        helptext = spec.help + (f" (default {_default_text(f, spec)})" if _default_text(f, spec) else "")
        if spec.deprecated:
            helptext = f"deprecated: {spec.deprecated}"
        metavar = None if spec.switch else spec.metavar
        groups[spec.group].add_argument(
            *names,
            dest=f.name,
            action=_Given,
            switch=spec.switch,
            metavar=metavar,
            default=None,
            help=helptext,
        )


@dataclass(frozen=True)
class Resolved:
    """What `resolve` found: field values to set, and the deprecated names used (old, new)."""

    values: dict[str, Any]
    deprecated: tuple[tuple[str, str], ...]
    given_as: dict[str, str]  # field -> how it was given, when not by its own flag (for errors)


def resolve(
    cls: type, args: argparse.Namespace, argv: Sequence[str] | None, env: Mapping[str, str]
) -> Resolved:
    """Field values from parsed `args` (text), then the environment; raises ConfigError (one line).
    The names typed come from `args` (`USED`) and, where given, `argv`."""
    values: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    deprecated: list[tuple[str, str]] = []
    used = _options_used(argv or ()) | set(getattr(args, USED, ()))
    for f, spec in settings_of(cls):
        deprecated.extend((alias, spec.flag) for alias in spec.aliases if alias in used)
        if spec.deprecated and spec.flag in used:
            deprecated.append((spec.flag, spec.deprecated))
        raw: Any = getattr(args, f.name, None)  # text, True for a switch, or None
        where = _used_name(spec, used)
        if raw is None:
            for name in (spec.flag, *spec.aliases):
                if env_name(name) in env:
                    raw, where = env[env_name(name)], f"{env_name(name)} ({spec.flag})"
                    if name != spec.flag:
                        deprecated.append((env_name(name), spec.env))
                    elif spec.deprecated:
                        deprecated.append((spec.env, spec.deprecated))
                    break
            if raw is None:
                continue
            if spec.switch:
                try:
                    raw = parse_bool(raw)
                except ValueError:
                    raise ConfigError(f"{where}: expected 1/true/yes or 0/false/no, got {raw!r}") from None
        if where != spec.flag:
            given_as[f.name] = where
        if spec.switch:
            values[f.name] = (not raw) if spec.negated else bool(raw)
            continue
        renamed = dict(spec.value_aliases).get(raw)
        if renamed is not None:
            deprecated.append((f"{where} {raw}", f"{spec.flag} {renamed}"))
            raw = renamed
        if spec.choices and raw not in spec.choices:
            raise ConfigError(f"{where}: expected one of {', '.join(spec.choices)}, got {raw!r}")
        try:
            values[f.name] = spec.parse(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {spec.expected}, got {raw!r}") from None
    return Resolved(values, tuple(dict.fromkeys(deprecated)), given_as)


def check(config: object, given_as: Mapping[str, str] | None = None) -> None:
    """Run every setting's check on `config`; raises ConfigError naming the flag, or how the value
    was given (`given_as`: an alias, or `GPULENS_X (--x)` for a variable)."""
    for f, spec in settings_of(type(config)):
        if spec.check is None:
            continue
        value = getattr(config, f.name)
        try:
            problem = spec.check(value)
        except OSError as exc:  # a path the system refuses to look up (too long, a loop)
            problem = f"cannot look up {_shortened(value)}: {exc.strerror or exc}"
        if problem is not None:
            raise ConfigError(f"{(given_as or {}).get(f.name, spec.flag)}: {problem}")


def _shortened(value: object, limit: int = 200) -> str:
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _options_used(argv: Sequence[str]) -> set[str]:
    """Option names given on the command line (`--a=1` and `--a 1` alike)."""
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def _used_name(spec: Setting, used: set[str]) -> str:
    """The name to put in an error: the alias the person typed, else the flag."""
    return next((alias for alias in spec.aliases if alias in used and spec.flag not in used), spec.flag)


def _default_text(f: dataclasses.Field[Any], spec: Setting) -> str:
    if spec.default_doc is not None:
        return spec.default_doc
    if spec.switch or f.default in (None, "", (), dataclasses.MISSING):
        return ""
    return _shown(f.default)


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def markdown_table(cls: type, extra: Sequence[tuple[str, str, str]] = ()) -> str:
    """The docs' flag table: `| flag | default | meaning |`, one row per setting, then `extra`
    rows (flags a part declares outside the dataclass, such as per-collector switches)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for f, spec in settings_of(cls):
        shown = f"`{spec.flag}`" if spec.switch else f"`{spec.flag} {spec.metavar}`"
        shown = shown.replace("|", "\\|")
        default = _default_text(f, spec)
        if spec.switch:
            default = spec.default_doc or "off"
        elif default and spec.default_doc is None:
            default = f"`{default}`" if not default.replace(".", "").isdigit() else default
        meaning = spec.help
        if spec.deprecated:
            meaning += f" (deprecated: use {spec.deprecated})"
        if spec.aliases:
            meaning += " (deprecated name: " + ", ".join(f"`{a}`" for a in spec.aliases) + ")"
        rows.append(f"| {shown} | {default} | {meaning.replace('|', chr(92) + '|')} |")
    rows.extend(f"| {a} | {b} | {c} |" for a, b, c in extra)
    return "\n".join(rows) + "\n"
