"""Slow readers for tests/reliability/test_slow_readers.py, run as their own process.

Keeps `--connections` connections to 127.0.0.1:`--port` that each send `--pipeline` requests for
`--path` at once and never read a byte of the answers (a 4 KiB receive window), so the server's
socket buffers fill and an answer waits on a reader that never comes. A connection the server
drops is opened again at once, until `--seconds` have passed. `--source` picks the readers' own
address (any of 127.0.0.0/8 on Linux), to tell them apart from the legitimate clients. With
`--tls` the connection first completes a TLS handshake (the CA certificate in `--ca`), then
does the same inside it. One thread per connection: blocking sockets keep the TLS handshake
simple, and 60 sleeping threads cost nothing. Prints one JSON object of counts at the end.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import threading
import time


def hold(
    args: argparse.Namespace, context: ssl.SSLContext | None, counts: dict[str, int], lock: threading.Lock
) -> None:
    request = f"GET {args.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * args.pipeline
    stop_at = time.monotonic() + args.seconds
    while time.monotonic() < stop_at:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(5)
        try:
            sock.bind((args.source, 0))
            sock.connect(("127.0.0.1", args.port))
            conn: socket.socket = context.wrap_socket(sock) if context is not None else sock
            conn.sendall(request)
        except OSError:
            sock.close()
            with lock:
                counts["failed_to_start"] += 1
            time.sleep(0.05)
            continue
        with lock:
            counts["opened"] += 1
        # never read: wait until the server gives up on us or the time is over
        while time.monotonic() < stop_at:
            time.sleep(0.25)
            if _closed_by_peer(sock):
                with lock:
                    counts["dropped_by_server"] += 1
                break
        conn.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed, from TCP_INFO's state: reading would take the answer."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    except OSError:
        return True
    return info[0] != 1  # not TCP_ESTABLISHED


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=60)
    parser.add_argument("--pipeline", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--path", default="/metrics")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--ca")
    parser.add_argument("--source", default="127.0.0.1", help="the readers' own address")
    args = parser.parse_args()
    context = None
    if args.tls:
        context = ssl.create_default_context(cafile=args.ca)
        context.check_hostname = False
    counts = {"opened": 0, "dropped_by_server": 0, "failed_to_start": 0}
    lock = threading.Lock()
    threads = [
        threading.Thread(target=hold, args=(args, context, counts, lock), daemon=True)
        for _ in range(args.connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
