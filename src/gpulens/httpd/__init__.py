"""The HTTP/1.1 server of the exporter and the remediation receiver: bounded and strict.

`server` holds the connections (one event-loop thread, deadlines, a connection cap that closes
the oldest idle connection first, EMFILE back-off, a parallel-request limit; its docstring says
why no server library is used), `parse` reads request heads and refuses ambiguous framing,
`negotiate` implements `Accept` / `Accept-Encoding` per RFC 9110, `tls` is TLS over memory buffers.
Only the standard library is used, so the exporter stays small.
"""
