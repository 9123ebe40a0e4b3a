"""`gpulens remediate return NODE`: ask the running receiver to return a node to service."""

from __future__ import annotations

import argparse
import base64
import json
import ssl

from gpulens import httpclient
from gpulens.remediate.auth import AuthConfigError, read_secret
from gpulens.remediate.usage import UsageError, fail


def client_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """`return`'s TLS client: the receiver's private CA (--ca-file) and, for a receiver that asks
    for client certificates, --cert-file/--key-file, as Prometheus' tls_config names them."""
    if args.key_file and not args.cert_file:
        raise UsageError("--key-file needs --cert-file")
    if not (args.ca_file or args.cert_file):
        return None  # the system's CAs (http.client's default context)
    flag, path = "--ca-file", args.ca_file
    try:
        context = ssl.create_default_context(cafile=str(args.ca_file) if args.ca_file else None)
        if args.cert_file:
            flag, path = "--cert-file", args.cert_file
            key = str(args.key_file) if args.key_file else None
            context.load_cert_chain(str(args.cert_file), key)
    except OSError as exc:  # ssl.SSLError too: not PEM, a key that does not match
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise UsageError(f"{flag} {path}: cannot load: {reason}") from None
    return context


def run_return(args: argparse.Namespace) -> int:
    """`gpulens remediate return NODE`: POST /-/return to the running receiver, print its answer."""
    try:
        headers = {"Content-Type": "application/json"}
        if args.token_file:
            headers["Authorization"] = f"Bearer {read_secret(args.token_file, '--token-file')}"
        elif args.basic_auth_user and args.basic_auth_password_file:
            password = read_secret(args.basic_auth_password_file, "--basic-auth-password-file")
            pair = base64.b64encode(f"{args.basic_auth_user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        else:
            raise UsageError("give --token-file, or --basic-auth-user with --basic-auth-password-file")
        context = client_tls(args)
        body = json.dumps({"node": args.node, "force": args.force}).encode()
        answer = httpclient.request(
            "POST",
            args.url.rstrip("/") + "/-/return",
            deadline=120,
            headers=headers,
            body=body,
            context=context,
        )
    except (UsageError, AuthConfigError, httpclient.HttpError) as exc:
        return fail(str(exc))
    try:
        doc = json.loads(answer.body)
        result, detail = doc["result"], doc["detail"]
    except (ValueError, KeyError, TypeError):
        return fail(f"{args.url}: HTTP {answer.status} {answer.body[:200].decode(errors='replace').strip()}")
    print(f"{result}: {detail}")
    return 0 if result in ("applied", "already", "dry_run") else 1
