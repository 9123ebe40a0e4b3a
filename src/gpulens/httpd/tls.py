"""TLS over memory buffers, so the event loop owns the socket and each connection's memory is small.

asyncio's own TLS transport preallocates a 256 KiB read buffer per connection (512 connections
would be 128 MiB, half the exporter's memory limit) and hides the socket behind a transport that
cannot be closed synchronously; an `ssl.SSLObject` over two `MemoryBIO`s costs what OpenSSL needs
(tens of KiB) and leaves closing, timeouts and eviction to the connection.
"""

from __future__ import annotations

import contextlib
import ssl

READ_CHUNK = 64 << 10


class TlsSession:
    """One server-side TLS session: feed it ciphertext, get plaintext; hand it plaintext to send."""

    __slots__ = ("_incoming", "_object", "_outgoing", "established")

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._object = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False

    def receive(self, ciphertext: bytes) -> tuple[bytes, bool]:
        """Plaintext decoded from `ciphertext` and whether the peer sent close_notify.

        Raises ssl.SSLError when the handshake fails (wrong protocol, no or untrusted client
        certificate, plain HTTP sent to the TLS port); `pending()` may then hold an alert to send.
        """
        self._incoming.write(ciphertext)
        if not self.established:
            try:
                self._object.do_handshake()
            except ssl.SSLWantReadError:
                return b"", False
            self.established = True
        chunks: list[bytes] = []
        while True:
            try:
                chunk = self._object.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                return b"".join(chunks), False
            except ssl.SSLZeroReturnError:
                return b"".join(chunks), True
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)

    def encrypt(self, plaintext: bytes) -> bytes:
        self._object.write(plaintext)
        return self._outgoing.read()

    def pending(self) -> bytes:
        """Bytes the session wants sent (handshake messages, session tickets, alerts)."""
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        # SSLWantReadError included: our close_notify is written, the peer's is not awaited
        with contextlib.suppress(ssl.SSLError):
            self._object.unwrap()
        return self._outgoing.read()
