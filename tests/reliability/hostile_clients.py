"""Hostile clients for tests/reliability/test_hostile_network.py, run as their own process.

Opens `--connections` TCP connections to 127.0.0.1:`--port` at `--rate` per second and holds them
for `--hold` seconds after the last one: even-numbered ones stay silent (idle), odd-numbered ones
send the start of a request head and then one more byte every `--trickle` seconds (slowloris), so
a head never completes. Everything is non-blocking from one thread, so the attack costs the
machine little CPU next to the server it attacks. Prints one JSON object of counts at the end:
how many were opened, how many the server closed, and the most it held open at once.
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import selectors
import socket
import time

HEAD_START = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\nX-Slow: "


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--trickle", type=float, default=0.5)
    parser.add_argument("--path", default="/metrics")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    selector = selectors.DefaultSelector()
    slow: dict[socket.socket, bool] = {}  # slowloris socket -> head started
    counts = {"opened": 0, "idle": 0, "slow": 0, "connect_failed": 0, "closed_by_server": 0}
    counts |= {"answered_by_server": 0, "trickled_bytes": 0, "max_open": 0}
    started = time.monotonic()
    stop_at = started + args.connections / args.rate + args.hold
    next_trickle = started + args.trickle
    head = HEAD_START.replace(b"/metrics", args.path.encode())

    def drop(sock: socket.socket) -> None:
        selector.unregister(sock)
        slow.pop(sock, None)
        sock.close()

    while time.monotonic() < stop_at:
        now = time.monotonic()
        due = min(args.connections, int((now - started) * args.rate) + 1)
        while counts["opened"] < due:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex(("127.0.0.1", args.port))
            if code not in (0, errno.EINPROGRESS):
                counts["connect_failed"] += 1
                sock.close()
                break
            is_slow = counts["opened"] % 2 == 1
            counts["opened"] += 1
            counts["slow" if is_slow else "idle"] += 1
            selector.register(sock, selectors.EVENT_READ)
            if is_slow:
                slow[sock] = False
        counts["max_open"] = max(counts["max_open"], len(selector.get_map()))
        if now >= next_trickle:
            next_trickle = now + args.trickle
            for sock in list(slow):
                try:
                    sent = sock.send(b"a" if slow[sock] else head)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    counts["closed_by_server"] += 1
                    drop(sock)
                    continue
                slow[sock] = True
                counts["trickled_bytes"] += sent
        for key, _ in selector.select(timeout=0.01):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                data = ready.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            counts["answered_by_server" if data else "closed_by_server"] += 1
            drop(ready)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
