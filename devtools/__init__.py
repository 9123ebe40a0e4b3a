"""Development tools that ship with the source but are not part of running gpulens.

`bench` (make bench), `conformance` (simulator vs a real GPU), `reliability` (the soak), `demo`
(make demo) and `ports` (a loopback free-port helper they share). Production code never imports
from here.
"""
