"""Authenticate the webhook caller: a shared bearer token or HTTP basic auth, nothing else.

Alertmanager sends either with its `http_config` (`authorization.credentials_file` or
`basic_auth.password_file`). Secrets are read from files so they stay out of process listings.
Basic auth users come from `--web.config.file`'s `basic_auth_users` (bcrypt hashes, the exporter's
format and checks: `gpulens.httpd.webconfig.BasicAuth`), or from the deprecated
`--basic-auth-user` / `--basic-auth-password-file` pair (one plaintext password).

A bcrypt check is slow on purpose: `verdict` answers without one where it can (the bearer token,
the plaintext pair, a cached bcrypt result) and says None where `verify` must run it, which the
server does on its worker pool, never on the event loop.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path

from gpulens.httpd.webconfig import BasicAuth

NO_CREDENTIALS = (
    "no credentials: give --token-file, or basic_auth_users in --web.config.file (or the deprecated "
    "--basic-auth-user with --basic-auth-password-file)"
)


class AuthConfigError(ValueError):
    """The secret files are missing or empty; one line naming the file."""


def read_secret(path: Path, what: str) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise AuthConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    if not secret:
        raise AuthConfigError(f"{what} {path}: the file is empty")
    return secret


@dataclass(frozen=True)
class Authenticator:
    token: str | None = None
    username: str | None = None  # the deprecated plaintext pair
    password: str | None = None
    users: BasicAuth | None = None  # --web.config.file's basic_auth_users

    def __post_init__(self) -> None:
        if not self.token and not (self.username and self.password) and self.users is None:
            raise AuthConfigError(NO_CREDENTIALS)

    def verdict(self, authorization: str | None) -> bool | None:
        """True or False when known without bcrypt; None when `verify` must decide."""
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            return bool(self.token) and hmac.compare_digest(value.encode(), str(self.token).encode())
        if scheme.lower() != "basic":
            return False
        if self.username and self.password and self._plain_pair(value):
            return True
        return False if self.users is None else self.users.cached(authorization)

    def verify(self, authorization: str | None) -> bool:
        """The full check, bcrypt included (blocking: tens of milliseconds)."""
        verdict = self.verdict(authorization)
        if verdict is not None:
            return verdict
        return self.users is not None and self.users.verify(authorization)

    def allows(self, authorization: str | None) -> bool:
        return self.verify(authorization)

    def _plain_pair(self, value: str) -> bool:
        assert self.username is not None and self.password is not None
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user_ok = hmac.compare_digest(user.encode(), self.username.encode())
        password_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return user_ok and password_ok
