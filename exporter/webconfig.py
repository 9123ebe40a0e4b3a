"""`--web.config-file`: TLS and basic auth in the format of Prometheus' exporter-toolkit.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_ca_file: ca.crt            # optional
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert | VerifyClientCertIfGiven | ...
      min_version: TLS12                # optional: TLS12 | TLS13
    basic_auth_users:
      alice: $2y$10$...                 # bcrypt hash

Relative paths are relative to the config file. Errors are `ConfigError`s naming the file and field.
Successful password checks are cached (keyed by a SHA-256 of user and password) because bcrypt is
deliberately slow and Prometheus sends the same credentials on every scrape.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulens.exporter.config import ConfigError

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TOP_LEVEL = {"tls_server_config", "basic_auth_users", "http_server_config"}
TLS_FIELDS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}


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


@dataclass
class BasicAuth:
    users: dict[str, bytes]
    _cache: dict[bytes, bool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, header: str | None) -> bool:
        """True when `header` (an Authorization value) names a user with the right password."""
        if not header or not header.lower().startswith("basic "):
            return False
        try:
            user, _, password = (
                base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
            )
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(user.encode() + b"\0" + password.encode() + b"\0" + hashed).digest()
        with self._lock:
            if self._cache.get(key):
                return True
        import bcrypt

        ok = bcrypt.checkpw(password.encode(), hashed)
        if ok:
            with self._lock:
                if len(self._cache) > 1024:
                    self._cache.clear()
                self._cache[key] = True
        return ok


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    basic_auth: BasicAuth | None = None


def load_web_config(path: Path) -> WebConfig:
    """Parse and check the file; the TLS context is built once here so bad certs fail at start."""
    where = f"--web.config-file {path}"
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: expected UTF-8 text, found byte 0x{exc.object[exc.start]:02x}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    if raw is None:
        return WebConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    unknown = set(raw) - TOP_LEVEL
    if unknown:
        raise ConfigError(
            f"{where}: unknown field {sorted(unknown)[0]!r} (expected {', '.join(sorted(TOP_LEVEL))})"
        )
    tls = _tls(raw.get("tls_server_config"), path.parent, where)
    auth = _basic_auth(raw.get("basic_auth_users"), where)
    config = WebConfig(tls=tls, basic_auth=auth)
    if tls is not None:
        try:
            tls.context()
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{where}: tls_server_config: cannot load certificate/key: {exc}") from exc
    return config


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
    unknown = set(section) - TLS_FIELDS
    if unknown:
        raise ConfigError(f"{where}: tls_server_config: unknown field {sorted(unknown)[0]!r}")
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
    for key in ("min_version", "max_version"):
        if section.get(key) is not None and section[key] not in TLS_VERSIONS:
            raise ConfigError(f"{where}: tls_server_config.{key}: expected TLS12 or TLS13")
    return TlsSettings(
        cert_file=_path(section.get("cert_file"), base, where, "cert_file"),
        key_file=_path(section.get("key_file"), base, where, "key_file"),
        client_ca_file=_path(ca, base, where, "client_ca_file") if ca else None,
        client_auth_type=auth_type,
        min_version=section.get("min_version"),
        max_version=section.get("max_version"),
    )


def _basic_auth(section: Any, where: str) -> BasicAuth | None:
    if section is None:
        return None
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"{where}: basic_auth_users: expected a mapping of user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"{where}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...)")
        users[str(user)] = hashed.encode()
    try:
        import bcrypt  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"{where}: basic_auth_users needs the bcrypt package (pip install 'gpulens[web]')"
        ) from exc
    return BasicAuth(users=users)
