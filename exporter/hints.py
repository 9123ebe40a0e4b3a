"""What to tell a user whose exporter cannot read any GPU, in the log and on the landing page.

The common case is a first try on a laptop or CI runner without an NVIDIA driver: NVML cannot be
loaded, and "NVML unavailable" alone does not say that `--simulate` exists. (The scenario names are
not listed here, where they would go stale: the exporter package never imports the simulator, and
`gpulens sim list` names them.)
"""

from __future__ import annotations


def no_gpu_hint(nvml_error: str) -> str:
    """One paragraph: why no GPU was read and the two ways forward."""
    return (
        f"No NVIDIA GPU could be read ({nvml_error or 'NVML unavailable'}). On a GPU node, check that "
        "the NVIDIA driver is loaded (nvidia-smi works) and that this process sees the GPUs (in a "
        "container: the NVIDIA container runtime, e.g. runtimeClassName: nvidia or --gpus all). To try "
        "gpulens without a GPU, run: gpulens-exporter --simulate dgx-h100 (`gpulens sim list` names the "
        "other built-in scenarios; docs/simulator.md)."
    )
