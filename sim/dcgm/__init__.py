"""A simulated DCGM, one level above the library: a fake of DCGM's Python bindings.

DESIGN §5: NVML is simulated underneath nvidia-ml-py; DCGM is simulated at the API of its Python
bindings, because nothing else in the stack talks to libdcgm. Two parts:

- `hostengine.py`: a host engine serving a `SimNode` (the same node the simulated NVML serves), so
  DCGM's profiling fields follow the scenario's activity. It is "installed" for the process like a
  loaded libdcgm (`install(node)`), with failure modes: no library, host engine unreachable, the
  profiling module not loaded, profiling unsupported on some GPUs.
- `bindings/`: top-level modules named like the real ones (`pydcgm`, `dcgm_structs`, `dcgm_fields`,
  `dcgm_agent`, `DcgmFieldGroup`, `dcgm_field_helpers`, `dcgmvalue`). Put `BINDINGS_DIR` on
  `sys.path` (or pass it to `--dcgm-bindings`) exactly as one would the real
  `/usr/share/datacenter-gpu-manager-4/bindings/python3`. They expose only what gpulens uses.
"""

from __future__ import annotations

from pathlib import Path

BINDINGS_DIR = Path(__file__).resolve().parent / "bindings"

__all__ = ["BINDINGS_DIR"]
