"""`--web.config.file`: TLS, basic auth and response headers in Prometheus' exporter-toolkit format.

The same file format for both servers (the exporter and `gpulens remediate`), as every Prometheus
exporter reads it:

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_ca_file: ca.crt            # optional
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert | VerifyClientCertIfGiven | ...
      min_version: TLS12                # optional: TLS12 | TLS13
      max_version: TLS13                # optional, not below min_version
    http_server_config:
      headers:                          # added to every answer; names and values as exporter-toolkit
        X-Content-Type-Options: nosniff # allows them
      http2: false                      # optional; HTTP/2 is not served, so `true` is refused
    basic_auth_users:
      alice: $2y$10$...                 # bcrypt hash

Relative paths are relative to the config file. Every problem is one `ConfigError` line naming the
file and field, found when the file is loaded (start-up, or a SIGHUP reload that then keeps the
previous configuration): an unknown key, a hash that is not a bcrypt hash, TLS `min_version` above
`max_version`, a client CA without a client auth type, a header exporter-toolkit does not allow.

Basic auth follows exporter-toolkit: an unknown user is checked against a dummy hash of the same
cost as the real ones (no timing difference tells whether a user exists); bcrypt reads at most 72
bytes of a password, so a longer one is checked by its first 72 bytes (what Go's bcrypt and the
original OpenBSD one do) and answered 401 like any wrong password; results, right and wrong, are
cached by a SHA-256 of user, password and hash, because bcrypt is deliberately slow and Prometheus
sends the same credentials on every scrape.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gpulens.safeload import InputError, read_yaml_file
from gpulens.serverflags import ConfigError

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TOP_LEVEL = {"tls_server_config", "basic_auth_users", "http_server_config"}
TLS_FIELDS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
# exporter-toolkit keys gpulens does not implement: refused by name rather than silently ignored
TOOLKIT_ONLY = {
    "rate_limit": "use --web.max-requests to bound parallel requests",
    "cert": "give the certificate as cert_file",
    "key": "give the key as key_file",
    "client_ca": "give the client CA as client_ca_file",
    "cipher_suites": "Python's TLS defaults are used",
    "curve_preferences": "Python's TLS defaults are used",
    "prefer_server_cipher_suites": "Python's TLS defaults are used",
    "client_allowed_sans": "restrict clients with client_ca_file instead",
}
HTTP_FIELDS = {"headers", "http2"}
# exporter-toolkit's allow-list (web/handler.go): header -> allowed values (None: any value)
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
BCRYPT_MAX_PASSWORD = 72
CACHE_SIZE = 1024
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str | None = None
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version] if self.min_version else ssl.TLSVersion.TLSv1_2
        if self.max_version:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        if self.client_ca_file is not None:
            ctx.load_verify_locations(cafile=str(self.client_ca_file))
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx

    @cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """The context every connection uses, built once (certificates are read at load)."""
        return self.context()


def bcrypt_cost(hashed: bytes) -> int:
    return int(hashed[4:6])


@dataclass
class BasicAuth:
    users: dict[str, bytes]
    dummy: bytes = b""  # a hash of a random password at the highest cost among `users`
    _cache: OrderedDict[bytes, bool] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.dummy:
            import bcrypt

            cost = max((bcrypt_cost(h) for h in self.users.values()), default=10)
            self.dummy = bcrypt.hashpw(secrets.token_hex(16).encode(), bcrypt.gensalt(rounds=cost))

    @staticmethod
    def credentials(header: str | None) -> tuple[str, bytes] | None:
        """(user, password) from an `Authorization: Basic ...` value; None when it is not one."""
        if not header or header[:6].lower() != "basic ":
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
        user, colon, password = decoded.partition(":")
        if not colon:
            return None
        return user, password.encode()

    def _key(self, user: str, password: bytes) -> tuple[bytes, bytes]:
        hashed = self.users.get(user, self.dummy)
        return hashlib.sha256(user.encode() + b"\0" + password + b"\0" + hashed).digest(), hashed

    def cached(self, header: str | None) -> bool | None:
        """The verdict without bcrypt: False for malformed credentials, a cached result, else None."""
        creds = self.credentials(header)
        if creds is None:
            return False
        key, _ = self._key(*creds)
        with self._lock:
            verdict = self._cache.get(key)
            if verdict is not None:
                self._cache.move_to_end(key)
            return verdict

    def verify(self, header: str | None) -> bool:
        """The full check (one bcrypt, also for unknown users); the result is cached."""
        import bcrypt

        creds = self.credentials(header)
        if creds is None:
            return False
        user, password = creds
        key, hashed = self._key(user, password)
        try:
            ok = bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD], hashed) and user in self.users
        except ValueError:  # hashes are validated at load; a NUL byte in the password lands here
            ok = False
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return ok

    def check(self, header: str | None) -> bool:
        """True when `header` (an Authorization value) names a user with the right password."""
        verdict = self.cached(header)
        return verdict if verdict is not None else self.verify(header)


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    basic_auth: BasicAuth | None = None
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        return self.tls.ssl_context if self.tls is not None else None


def load_web_config(path: Path) -> WebConfig:
    """Parse and check the file; the TLS context is built here, so bad certificates fail at load."""
    where = f"--web.config.file {path}"
    try:
        raw = read_yaml_file(path, where)
    except InputError as exc:  # unreadable, not UTF-8, over the YAML byte bound, or not YAML
        raise ConfigError(str(exc)) from exc
    if raw is None:
        return WebConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    _refuse_unknown(raw, TOP_LEVEL, where, "")
    tls = _tls(raw.get("tls_server_config"), path.parent, where)
    headers = _http(raw.get("http_server_config"), where)
    auth = _basic_auth(raw.get("basic_auth_users"), where)
    if tls is not None:
        try:
            _ = tls.ssl_context
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{where}: tls_server_config: cannot load certificate/key: {exc}") from exc
    return WebConfig(tls=tls, basic_auth=auth, headers=headers)


def _refuse_unknown(section: dict[str, Any], known: set[str], where: str, prefix: str) -> None:
    unknown = sorted(str(k) for k in section if k not in known)
    if not unknown:
        return
    key = unknown[0]
    if key in TOOLKIT_ONLY:
        raise ConfigError(f"{where}: {prefix}{key}: not supported by gpulens ({TOOLKIT_ONLY[key]})")
    raise ConfigError(f"{where}: {prefix}unknown field {key!r} (expected {', '.join(sorted(known))})")


def _path(value: Any, base: Path, where: str, name: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: tls_server_config.{name}: expected a file path")
    path = Path(value)
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise ConfigError(f"{where}: tls_server_config.{name}: {path} does not exist")
    return path


def _tls(section: Any, base: Path, where: str) -> TlsSettings | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: tls_server_config: expected a mapping")
    _refuse_unknown(section, TLS_FIELDS, where, "tls_server_config: ")
    auth_type = section.get("client_auth_type", "NoClientCert") or "NoClientCert"
    if auth_type in UNSUPPORTED_CLIENT_AUTH:
        raise ConfigError(
            f"{where}: tls_server_config.client_auth_type: {auth_type} is not supported; use "
            "VerifyClientCertIfGiven or RequireAndVerifyClientCert"
        )
    if auth_type not in CLIENT_AUTH:
        raise ConfigError(
            f"{where}: tls_server_config.client_auth_type: expected one of {', '.join(CLIENT_AUTH)}"
        )
    ca = section.get("client_ca_file")
    if auth_type != "NoClientCert" and not ca:
        raise ConfigError(
            f"{where}: tls_server_config.client_ca_file: required for client_auth_type {auth_type}"
        )
    if ca and auth_type == "NoClientCert":
        raise ConfigError(
            f"{where}: tls_server_config.client_ca_file: given without a client_auth_type that uses it "
            "(VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
        )
    for key in ("min_version", "max_version"):
        if section.get(key) is not None and section[key] not in TLS_VERSIONS:
            raise ConfigError(f"{where}: tls_server_config.{key}: expected TLS12 or TLS13")
    low, high = section.get("min_version"), section.get("max_version")
    if low and high and TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        raise ConfigError(
            f"{where}: tls_server_config.min_version: {low} is above max_version {high}: no TLS version "
            "would be left"
        )
    return TlsSettings(
        cert_file=_path(section.get("cert_file"), base, where, "cert_file"),
        key_file=_path(section.get("key_file"), base, where, "key_file"),
        client_ca_file=_path(ca, base, where, "client_ca_file") if ca else None,
        client_auth_type=auth_type,
        min_version=low,
        max_version=high,
    )


def _http(section: Any, where: str) -> tuple[tuple[str, str], ...]:
    """`http_server_config`: `headers` are sent with every answer; `http2: true` is refused."""
    if section is None:
        return ()
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: http_server_config: expected a mapping")
    _refuse_unknown(section, HTTP_FIELDS, where, "http_server_config: ")
    http2 = section.get("http2")
    if http2 is not None and not isinstance(http2, bool):
        raise ConfigError(f"{where}: http_server_config.http2: expected true or false")
    if http2:
        raise ConfigError(
            f"{where}: http_server_config.http2: HTTP/2 is not served (HTTP/1.1 only); set false or remove"
        )
    headers = section.get("headers")
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise ConfigError(f"{where}: http_server_config.headers: expected a mapping of header to value")
    result: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name not in ALLOWED_HEADERS:
            raise ConfigError(
                f"{where}: http_server_config.headers: {str(name)!r} can not be configured "
                f"(allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        allowed = ALLOWED_HEADERS[name]
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise ConfigError(f"{where}: http_server_config.headers.{name}: expected one line of text")
        if allowed is not None and value not in allowed:
            raise ConfigError(
                f"{where}: http_server_config.headers.{name}: expected one of {', '.join(allowed)}"
            )
        result.append((name, value))
    return tuple(result)


def _basic_auth(section: Any, where: str) -> BasicAuth | None:
    if section is None:
        return None
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"{where}: basic_auth_users: expected a mapping of user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        # the value is never echoed: it may be a plaintext password pasted by mistake
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            raise ConfigError(
                f"{where}: basic_auth_users.{user}: not a bcrypt hash (expected $2y$<cost 04-31>$ "
                "followed by 53 characters, e.g. from htpasswd -nBC 10)"
            )
        users[str(user)] = hashed.encode()
    try:
        import bcrypt  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"{where}: basic_auth_users needs the bcrypt package (pip install 'gpulens[web]')"
        ) from exc
    return BasicAuth(users=users)
