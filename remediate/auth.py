"""Authenticate the webhook caller: a shared bearer token or HTTP basic auth, nothing else.

Alertmanager sends either with its `http_config` (`authorization.credentials_file` or
`basic_auth.password_file`). Secrets are read from files so they stay out of process listings.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from pathlib import Path


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
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if not self.token and not (self.username and self.password):
            raise AuthConfigError(
                "no credentials: give --token-file, or --basic-auth-user with --basic-auth-password-file"
            )

    def allows(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme.lower() == "basic" and self.username and self.password:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user_ok = hmac.compare_digest(user.encode(), self.username.encode())
            password_ok = hmac.compare_digest(password.encode(), self.password.encode())
            return user_ok and password_ok
        return False
