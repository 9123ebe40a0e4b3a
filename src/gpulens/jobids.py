"""Job ids the exporter publishes for rows that are not a user's job, which the analyzer reads back.

Defined once here, in the shared core, because the analyzer may not import the exporter
(docs/architecture.md, the layering rules): both take the id from this module, so the row the
exporter writes and the row the analyzer looks for cannot drift apart.
"""

from __future__ import annotations

# an MPS server process (nvidia-cuda-mps-server): infrastructure that runs no kernels of its own,
# published under this job id with the "system" source (exporter/attribution/aggregate.py)
MPS_SERVER_JOB_ID = "mps_server"
