"""`--compat`: which other exporters' series to emit beside the native ones, and in which version.

The value is a comma-separated list of modes: `dcgm` (dcgm-exporter; optionally `dcgm=<version>`)
and `jobstats` (the series Princeton jobstats queries, as its NVIDIA exporter names them) and
`nvidia_gpu_exporter` (utkuozdemir/nvidia_gpu_exporter's `nvidia_smi_*` series). The
dcgm-exporter version decides the label spellings that changed between releases: up to 4.8.2 the
host label is `Hostname`, from 4.8.3 (#655) it is `hostname`. dcgm-exporter tags its releases
`<DCGM version>-<exporter version>` (`4.5.3-4.8.2`); either the exporter version or the whole tag is
accepted. 4.9 renamed fields and changed their units; it is refused until gpulens serves its names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DCGM = "dcgm"
JOBSTATS = "jobstats"
NVIDIA_GPU_EXPORTER = "nvidia_gpu_exporter"
MODES = (DCGM, JOBSTATS, NVIDIA_GPU_EXPORTER)

DCGM_DEFAULT_VERSION = (4, 8, 2)
DCGM_OLDEST = (3, 0, 0)  # 3.x has the same field names and labels
DCGM_FIRST_UNSUPPORTED = (4, 9, 0)  # renamed fields and units
DCGM_LOWERCASE_HOSTNAME = (4, 8, 3)

# the --compat flag's help and docs/exporter.md's line (exporter/config.py declares the flag)
HELP = (
    "also emit another exporter's names, units and labels: `dcgm` (dcgm-exporter 4.8.2), "
    "`dcgm=<version>` (3.0 to 4.8.x; from 4.8.3 the host label is `hostname`), `jobstats` (Princeton "
    "jobstats; [docs/dcgm.md](dcgm.md), [docs/migrate-jobstats.md](migrate-jobstats.md)), "
    "`nvidia_gpu_exporter` (its `nvidia_smi_*` series; "
    "[docs/migrate-nvidia-gpu-exporter.md](migrate-nvidia-gpu-exporter.md)); comma-separated"
)

_VERSION = re.compile(r"^(?:\d+\.\d+\.\d+-)?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?$")


class CompatError(ValueError):
    """A bad `--compat` value; `str()` is one line."""


@dataclass(frozen=True)
class CompatSpec:
    """Parsed `--compat`: the dcgm-exporter version to look like (None: off) and jobstats on/off."""

    dcgm: tuple[int, int, int] | None = None
    jobstats: bool = False
    nvidia_gpu_exporter: bool = False

    @property
    def dcgm_hostname_label(self) -> str:
        version = self.dcgm or DCGM_DEFAULT_VERSION
        return "hostname" if version >= DCGM_LOWERCASE_HOSTNAME else "Hostname"

    @property
    def modes(self) -> frozenset[str]:
        """The modes that are on (the `compat` of the collectors they enable)."""
        on = {
            DCGM: self.dcgm is not None,
            JOBSTATS: self.jobstats,
            NVIDIA_GPU_EXPORTER: self.nvidia_gpu_exporter,
        }
        return frozenset(mode for mode, enabled in on.items() if enabled)

    def __bool__(self) -> bool:
        return self.dcgm is not None or self.jobstats or self.nvidia_gpu_exporter


def _dcgm_version(text: str) -> tuple[int, int, int]:
    match = _VERSION.match(text.strip())
    if not match:
        raise CompatError(f"--compat: dcgm version must look like 4.8, 4.8.3 or 4.5.3-4.8.2, got {text!r}")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    shown = ".".join(map(str, version))
    if version < DCGM_OLDEST:
        raise CompatError(
            f"--compat: dcgm-exporter {shown} is older than 3.0, which gpulens does not emulate"
        )
    if version >= DCGM_FIRST_UNSUPPORTED:
        raise CompatError(
            f"--compat: dcgm-exporter {shown} renamed its fields and units (4.9); "
            "gpulens emulates 3.0 to 4.8.x"
        )
    return version


def parse_compat(value: str) -> CompatSpec:
    """`"dcgm=4.8.3,jobstats"` -> CompatSpec(dcgm=(4, 8, 3), jobstats=True); raises CompatError."""
    dcgm: tuple[int, int, int] | None = None
    jobstats = nvidia_gpu_exporter = False
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        mode, sep, version = part.partition("=")
        mode = mode.strip().lower()
        if mode == DCGM:
            dcgm = _dcgm_version(version) if sep else DCGM_DEFAULT_VERSION
        elif mode == JOBSTATS and not sep:
            jobstats = True
        elif mode == NVIDIA_GPU_EXPORTER and not sep:
            nvidia_gpu_exporter = True
        elif mode in (JOBSTATS, NVIDIA_GPU_EXPORTER):
            raise CompatError(f"--compat: {mode} takes no version, got {part!r}")
        else:
            raise CompatError(
                f"--compat: expected dcgm, dcgm=<version>, jobstats or nvidia_gpu_exporter, got {part!r}"
            )
    return CompatSpec(dcgm=dcgm, jobstats=jobstats, nvidia_gpu_exporter=nvidia_gpu_exporter)
