"""A simulated NVML shared library underneath the real nvidia-ml-py.

`SimLib(node)` implements the NVML C API with `ctypes.CFUNCTYPE` callbacks that serve a `SimNode`
(see `gpulens.sim.state`); `gpulens.sim.install.install(node)` puts it where
pynvml looks for `libnvidia-ml.so.1`. One module per area: identity, memory (and utilization),
power (thermal, clocks), pcie (and NVLink), fields, health (ECC, retired pages, remapped rows),
events, processes (and accounting), mig, gpm.
"""

from gpulens.sim.nvml.lib import SimLib, all_symbols

__all__ = ["SimLib", "all_symbols"]
