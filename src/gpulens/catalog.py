"""GPU models and MIG profile tables: the single source of truth for the simulator, the exporter
and the analyzer.

Facts come from `shared/reference/rightsizing.md` §3 (NVIDIA MIG user guide, mig-parted defaults,
`nvidia-smi mig -lgip/-lgipp` outputs quoted in public repositories). Where a number is not
verified it says so next to it; read real SM counts from NVML when a GPU is present.

MIG geometry on 7-slice GPUs (A100/H100/H200/B200): a GPU instance occupies `placement_size`
consecutive memory slices (of 8) starting at one of `placement_starts`, and `compute_slices` of the
7 compute slices. Instances may not overlap on the memory axis and their compute slices add up
to at most 7. A30 has 4 compute and 4 memory slices. Placing instances on that geometry is
`migplacement.py`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

MIB = 1024**2
GIB = 1024**3

# NVML_DEVICE_ARCH_* values
ARCH_AMPERE = 7
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10

# NVML_GPU_INSTANCE_PROFILE_* and NVML_COMPUTE_INSTANCE_PROFILE_* values
_GI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
_GI_PROFILE_1_SLICE_REV1 = 7  # 1g + media extensions
_GI_PROFILE_1_SLICE_REV2 = 9  # 1g with two memory slices (1g.10gb on A100-40GB, 1g.20gb on 80GB)
_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

# `nvidia-smi mig -lgip` profile ids (what operators type); keyed by (compute, memory slices, +me)
_SMI_PROFILE_ID_7 = {
    (1, 1, False): 19,
    (1, 1, True): 20,
    (1, 2, False): 15,
    (2, 2, False): 14,
    (3, 4, False): 9,
    (4, 4, False): 5,
    (7, 8, False): 0,
}
_SMI_PROFILE_ID_A30 = {
    (1, 1, False): 14,
    (1, 1, True): 21,
    (2, 2, False): 5,
    (2, 2, True): 6,
    (4, 4, False): 0,
}


class CatalogError(ValueError):
    """An unknown model/profile or an impossible MIG layout; the message is one line."""


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model."""

    name: str  # "3g.40gb" (with "+me" for media extensions)
    nvml_profile: int  # NVML_GPU_INSTANCE_PROFILE_* (argument to GetGpuInstanceProfileInfo)
    nvml_ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* of the full-size compute instance
    smi_profile_id: int  # id printed by `nvidia-smi mig -lgip`
    compute_slices: int
    memory_slices: int
    sm_count: int
    memory_bytes: int  # usable memory of the instance as NVML reports it
    max_instances: int  # instances of this profile alone on one GPU
    placement_starts: tuple[int, ...]  # valid start memory slices
    placement_size: int  # memory slices occupied
    media_extensions: bool = False

    @property
    def copy_engines(self) -> int:
        return max(1, self.compute_slices)


@dataclass(frozen=True)
class GpuModel:
    """One GPU model as NVML reports it, with the numbers rightsizing needs."""

    key: str  # catalog key, e.g. "H100-80GB"
    nvml_name: str  # nvmlDeviceGetName
    architecture: str  # "ampere", "hopper", "blackwell"
    nvml_architecture: int  # NVML_DEVICE_ARCH_*
    cuda_compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int  # total framebuffer as NVML reports it
    memory_bandwidth_bytes_per_second: int  # peak
    power_limit_watts: int  # default / max board power
    idle_power_watts: int
    pcie_generation: int
    pcie_width: int
    nvlink_links: int
    pci_device_id: int  # nvmlPciInfo_t.pciDeviceId
    max_sm_clock_mhz: int
    max_memory_clock_mhz: int
    compute_slices: int  # MIG compute slices (0 = no MIG)
    memory_slices: int
    mig_profiles: tuple[MigProfile, ...]
    has_fan: bool = False  # SXM boards are fanless: NVML fan speed is NOT_SUPPORTED
    ecc_default: bool = True
    row_remapping: bool = True  # Ampere and newer remap rows instead of retiring pages
    gpm_supported: bool = False  # NVML GPM: Hopper and newer
    mps_max_clients: int = 48
    # framebuffer the driver keeps (NVML v2 `reserved`), where a real GPU showed it; None: estimated
    memory_reserved_bytes: int | None = None

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        valid = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG)"
        raise CatalogError(f"MIG profile {name!r} does not exist on {self.key}; valid: {valid}")

    def mig_profile_by_nvml_id(self, nvml_profile: int) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.nvml_profile == nvml_profile), None)


def _profiles_7(
    mem_gb: dict[str, int], mem_mib: dict[str, int], sms: dict[str, int]
) -> tuple[MigProfile, ...]:
    """The classic 7-compute/8-memory-slice profile set.

    `mem_gb` names the profiles (the marketing size), `mem_mib` gives usable MiB, `sms` SM counts,
    keyed "1g", "1g2" (double-memory 1g), "2g", "3g", "4g", "7g".
    """
    shapes = {  # key: (compute, memory slices, placement starts, max instances)
        "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        "1g2": (1, 2, (0, 2, 4, 6), 4),
        "2g": (2, 2, (0, 2, 4), 3),
        "3g": (3, 4, (0, 4), 2),
        "4g": (4, 4, (0,), 1),
        "7g": (7, 8, (0,), 1),
    }
    out: list[MigProfile] = []
    for key, (compute, memory, starts, max_n) in shapes.items():
        name = f"{compute}g.{mem_gb[key]}gb"
        nvml = _GI_PROFILE_1_SLICE_REV2 if key == "1g2" else _GI_PROFILE[compute]
        out.append(
            MigProfile(
                name=name,
                nvml_profile=nvml,
                nvml_ci_profile=_CI_PROFILE[compute],
                smi_profile_id=_SMI_PROFILE_ID_7[(compute, memory, False)],
                compute_slices=compute,
                memory_slices=memory,
                sm_count=sms[key],
                memory_bytes=mem_mib[key] * MIB,
                max_instances=max_n,
                placement_starts=starts,
                placement_size=memory,
            )
        )
        if key == "1g":
            out.append(
                MigProfile(
                    name=f"{name}+me",
                    nvml_profile=_GI_PROFILE_1_SLICE_REV1,
                    nvml_ci_profile=_CI_PROFILE[1],
                    smi_profile_id=_SMI_PROFILE_ID_7[(1, 1, True)],
                    compute_slices=1,
                    memory_slices=1,
                    sm_count=sms[key],
                    memory_bytes=mem_mib[key] * MIB,
                    max_instances=1,
                    placement_starts=starts,
                    placement_size=1,
                    media_extensions=True,
                )
            )
    return tuple(out)


_A100_SMS = {"1g": 14, "1g2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_HOPPER_SMS = {"1g": 16, "1g2": 16, "2g": 32, "3g": 60, "4g": 64, "7g": 132}
# B200 per-slice SM counts are not verified (reference §3.1); scaled from 148 SMs like Hopper's.
_B200_SMS = {"1g": 18, "1g2": 18, "2g": 36, "3g": 66, "4g": 72, "7g": 144}

_A30_PROFILES = (
    MigProfile(
        "1g.6gb",
        _GI_PROFILE[1],
        _CI_PROFILE[1],
        _SMI_PROFILE_ID_A30[(1, 1, False)],
        1,
        1,
        14,
        5836 * MIB,
        4,
        (0, 1, 2, 3),
        1,
    ),
    MigProfile(
        "1g.6gb+me",
        _GI_PROFILE_1_SLICE_REV1,
        _CI_PROFILE[1],
        _SMI_PROFILE_ID_A30[(1, 1, True)],
        1,
        1,
        14,
        5836 * MIB,
        1,
        (0, 1, 2, 3),
        1,
        media_extensions=True,
    ),
    MigProfile(
        "2g.12gb",
        _GI_PROFILE[2],
        _CI_PROFILE[2],
        _SMI_PROFILE_ID_A30[(2, 2, False)],
        2,
        2,
        28,
        11904 * MIB,
        2,
        (0, 2),
        2,
    ),
    MigProfile(
        "2g.12gb+me",
        8,
        _CI_PROFILE[2],
        _SMI_PROFILE_ID_A30[(2, 2, True)],
        2,
        2,
        28,
        11904 * MIB,
        1,
        (0, 2),
        2,
        media_extensions=True,
    ),
    MigProfile(
        "4g.24gb",
        _GI_PROFILE[4],
        _CI_PROFILE[4],
        _SMI_PROFILE_ID_A30[(4, 4, False)],
        4,
        4,
        56,
        24064 * MIB,
        1,
        (0,),
        4,
    ),
)

# ---------------------------------------------------------------- inference and PCIe data-centre GPUs
#
# Board figures (SMs, memory, bandwidth, board power, boost and memory clocks) are NVIDIA's product
# datasheets'; "NVML MiB" is the total nvidia-smi/NVML prints for the board. PCI device ids of the
# MIG-capable models are the ones mig-parted's default config filters on. Marked "not verified":
# figures no NVIDIA document at hand states (idle power everywhere; MIG slice SMs and usable MiB of
# tables without a published `nvidia-smi mig -lgip`, which are scaled conservatively from a verified
# table: a slice never looks larger than it is).
#
# MPS: every model here is Volta or newer, so 48 clients per GPU (NVIDIA's MPS documentation, CUDA
# <= 13.0). The NVIDIA device plugin's own MPS check allows only 16 below compute capability 7.5
# (V100, 7.0): `analyzer.validate.device_plugin.mps_max_clients` applies that when configs are emitted.

ARCH_VOLTA = 5
ARCH_TURING = 6
ARCH_ADA = 8

# usable MiB of MIG slices for tables without a published -lgip: 0.88 x the size in the profile
# name (the lowest ratio among verified tables is H200's 1g.18gb at 0.889); not verified
_UNVERIFIED_USABLE = 0.88


def _usable(mem_gb: dict[str, int]) -> dict[str, int]:
    return {k: int(v * 1024 * _UNVERIFIED_USABLE) for k, v in mem_gb.items()}


def _scaled_sms(total: int) -> dict[str, int]:
    """Per-slice SMs scaled from Hopper's verified split (16 of 132 per 1g slice); not verified."""
    return {k: max(1, v * total // 132) for k, v in _HOPPER_SMS.items()}


def _board(**fields: Any) -> GpuModel:
    """A GPU without MIG (no slices, no profiles)."""
    return GpuModel(compute_slices=0, memory_slices=0, mig_profiles=(), **fields)


_MIG_96GB = {"1g": 12, "1g2": 24, "2g": 24, "3g": 48, "4g": 48, "7g": 96}  # H100 96GB, GH200, H20
_MIG_GH200_144GB = {"1g": 18, "1g2": 36, "2g": 36, "3g": 72, "4g": 72, "7g": 144}
_MIG_B300 = {"1g": 34, "1g2": 67, "2g": 67, "3g": 135, "4g": 135, "7g": 269}

_MORE = (
    _board(
        key="T4-16GB",
        nvml_name="Tesla T4",
        architecture="turing",
        nvml_architecture=ARCH_TURING,
        cuda_compute_capability=(7, 5),
        sm_count=40,
        memory_bytes=15360 * MIB,
        memory_bandwidth_bytes_per_second=320_000_000_000,
        power_limit_watts=70,
        idle_power_watts=10,  # not verified
        pcie_generation=3,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x1EB810DE,
        max_sm_clock_mhz=1590,
        max_memory_clock_mhz=5001,
        row_remapping=False,  # Turing retires pages
    ),
    _board(
        key="V100-SXM2-16GB",
        nvml_name="Tesla V100-SXM2-16GB",
        architecture="volta",
        nvml_architecture=ARCH_VOLTA,
        cuda_compute_capability=(7, 0),
        sm_count=80,
        memory_bytes=16160 * MIB,
        memory_bandwidth_bytes_per_second=900_000_000_000,
        power_limit_watts=300,
        idle_power_watts=40,  # not verified
        pcie_generation=3,
        pcie_width=16,
        nvlink_links=6,
        pci_device_id=0x1DB110DE,
        max_sm_clock_mhz=1530,
        max_memory_clock_mhz=877,
        row_remapping=False,
    ),
    _board(
        key="V100-SXM2-32GB",
        nvml_name="Tesla V100-SXM2-32GB",
        architecture="volta",
        nvml_architecture=ARCH_VOLTA,
        cuda_compute_capability=(7, 0),
        sm_count=80,
        memory_bytes=32768 * MIB,  # NVML MiB not verified
        memory_bandwidth_bytes_per_second=900_000_000_000,
        power_limit_watts=300,
        idle_power_watts=40,  # not verified
        pcie_generation=3,
        pcie_width=16,
        nvlink_links=6,
        pci_device_id=0x1DB510DE,
        max_sm_clock_mhz=1530,
        max_memory_clock_mhz=877,
        row_remapping=False,
    ),
    _board(
        key="V100-PCIE-16GB",
        nvml_name="Tesla V100-PCIE-16GB",
        architecture="volta",
        nvml_architecture=ARCH_VOLTA,
        cuda_compute_capability=(7, 0),
        sm_count=80,
        memory_bytes=16160 * MIB,
        memory_bandwidth_bytes_per_second=900_000_000_000,
        power_limit_watts=250,
        idle_power_watts=30,  # not verified
        pcie_generation=3,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x1DB410DE,
        max_sm_clock_mhz=1380,
        max_memory_clock_mhz=877,
        row_remapping=False,
    ),
    _board(
        key="A10-24GB",
        nvml_name="NVIDIA A10",
        architecture="ampere",
        nvml_architecture=ARCH_AMPERE,
        cuda_compute_capability=(8, 6),
        sm_count=72,
        memory_bytes=23028 * MIB,
        memory_bandwidth_bytes_per_second=600_000_000_000,
        power_limit_watts=150,
        idle_power_watts=20,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x223610DE,
        max_sm_clock_mhz=1695,
        max_memory_clock_mhz=6251,
    ),
    _board(
        key="A10G-24GB",
        nvml_name="NVIDIA A10G",
        architecture="ampere",
        nvml_architecture=ARCH_AMPERE,
        cuda_compute_capability=(8, 6),
        sm_count=80,
        memory_bytes=23028 * MIB,
        memory_bandwidth_bytes_per_second=600_000_000_000,
        power_limit_watts=300,  # the cap nvidia-smi shows on AWS G5; not verified against a datasheet
        idle_power_watts=20,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x223710DE,
        max_sm_clock_mhz=1710,
        max_memory_clock_mhz=6251,
    ),
    _board(
        key="A40-48GB",
        nvml_name="NVIDIA A40",
        architecture="ampere",
        nvml_architecture=ARCH_AMPERE,
        cuda_compute_capability=(8, 6),
        sm_count=84,
        memory_bytes=46068 * MIB,
        memory_bandwidth_bytes_per_second=696_000_000_000,
        power_limit_watts=300,
        idle_power_watts=30,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=4,  # one NVLink bridge to a second board; link count not verified
        pci_device_id=0x223510DE,
        max_sm_clock_mhz=1740,
        max_memory_clock_mhz=7251,
    ),
    _board(
        key="L4-24GB",
        nvml_name="NVIDIA L4",
        architecture="ada",
        nvml_architecture=ARCH_ADA,
        cuda_compute_capability=(8, 9),
        sm_count=58,
        memory_bytes=23034 * MIB,
        memory_bandwidth_bytes_per_second=300_000_000_000,
        power_limit_watts=72,
        idle_power_watts=16,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x27B810DE,
        max_sm_clock_mhz=2040,
        max_memory_clock_mhz=6251,
    ),
    _board(
        key="L40S-48GB",
        nvml_name="NVIDIA L40S",
        architecture="ada",
        nvml_architecture=ARCH_ADA,
        cuda_compute_capability=(8, 9),
        sm_count=142,
        memory_bytes=46068 * MIB,
        memory_bandwidth_bytes_per_second=864_000_000_000,
        power_limit_watts=350,
        idle_power_watts=35,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x26B910DE,
        max_sm_clock_mhz=2520,
        max_memory_clock_mhz=9001,
    ),
    _board(
        # the workstation board in GPU servers and desktops: actively cooled, so NVML reports its
        # fan (every data-centre board above is passive: fan speed NOT_SUPPORTED)
        key="RTX6000-ADA-48GB",
        nvml_name="NVIDIA RTX 6000 Ada Generation",
        architecture="ada",
        nvml_architecture=ARCH_ADA,
        cuda_compute_capability=(8, 9),
        sm_count=142,
        memory_bytes=49140 * MIB,  # not verified (nvidia-smi's total on this board)
        memory_bandwidth_bytes_per_second=960_000_000_000,
        power_limit_watts=300,
        idle_power_watts=20,  # not verified
        pcie_generation=4,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x26B110DE,
        max_sm_clock_mhz=2505,
        max_memory_clock_mhz=10001,  # not verified (20 Gbps GDDR6)
        has_fan=True,
    ),
    GpuModel(
        key="H100-PCIE-80GB",
        nvml_name="NVIDIA H100 PCIe",
        architecture="hopper",
        nvml_architecture=ARCH_HOPPER,
        cuda_compute_capability=(9, 0),
        sm_count=114,
        memory_bytes=81559 * MIB,
        memory_bandwidth_bytes_per_second=2_000_000_000_000,
        power_limit_watts=350,
        idle_power_watts=50,  # not verified
        pcie_generation=5,
        pcie_width=16,
        nvlink_links=0,
        pci_device_id=0x233110DE,
        max_sm_clock_mhz=1755,
        max_memory_clock_mhz=1593,
        compute_slices=7,
        memory_slices=8,
        gpm_supported=True,
        # the H100-80GB profile names and usable MiB (one table for SXM5 and PCIe); SMs scaled
        mig_profiles=_profiles_7(
            {"1g": 10, "1g2": 20, "2g": 20, "3g": 40, "4g": 40, "7g": 80},
            {"1g": 9984, "1g2": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
            _scaled_sms(114),
        ),
    ),
    GpuModel(
        key="H20-96GB",
        nvml_name="NVIDIA H20",
        architecture="hopper",
        nvml_architecture=ARCH_HOPPER,
        cuda_compute_capability=(9, 0),
        sm_count=78,
        memory_bytes=97871 * MIB,  # NVML MiB not verified
        memory_bandwidth_bytes_per_second=4_000_000_000_000,
        power_limit_watts=400,
        idle_power_watts=60,  # not verified
        pcie_generation=5,
        pcie_width=16,
        nvlink_links=18,
        pci_device_id=0x232910DE,
        max_sm_clock_mhz=1980,
        max_memory_clock_mhz=2619,
        compute_slices=7,
        memory_slices=8,
        gpm_supported=True,
        mig_profiles=_profiles_7(_MIG_96GB, _usable(_MIG_96GB), _scaled_sms(78)),
    ),
    GpuModel(
        key="GH200-96GB",
        nvml_name="NVIDIA GH200 480GB",
        architecture="hopper",
        nvml_architecture=ARCH_HOPPER,
        cuda_compute_capability=(9, 0),
        sm_count=132,
        memory_bytes=97871 * MIB,  # NVML MiB not verified
        memory_bandwidth_bytes_per_second=4_000_000_000_000,
        power_limit_watts=900,  # the module's (Grace + Hopper) default; configurable
        idle_power_watts=100,  # not verified
        pcie_generation=5,
        pcie_width=16,
        nvlink_links=18,
        pci_device_id=0x234210DE,
        max_sm_clock_mhz=1980,
        max_memory_clock_mhz=2619,
        compute_slices=7,
        memory_slices=8,
        gpm_supported=True,
        mig_profiles=_profiles_7(_MIG_96GB, _usable(_MIG_96GB), _HOPPER_SMS),
    ),
    GpuModel(
        key="GH200-144GB",
        nvml_name="NVIDIA GH200 144G HBM3e",
        architecture="hopper",
        nvml_architecture=ARCH_HOPPER,
        cuda_compute_capability=(9, 0),
        sm_count=132,
        memory_bytes=146_944 * MIB,  # not verified
        memory_bandwidth_bytes_per_second=4_900_000_000_000,
        power_limit_watts=1000,  # module maximum; configurable
        idle_power_watts=100,  # not verified
        pcie_generation=5,
        pcie_width=16,
        nvlink_links=18,
        pci_device_id=0x234810DE,
        max_sm_clock_mhz=1980,
        max_memory_clock_mhz=2619,
        compute_slices=7,
        memory_slices=8,
        gpm_supported=True,
        mig_profiles=_profiles_7(_MIG_GH200_144GB, _usable(_MIG_GH200_144GB), _HOPPER_SMS),
    ),
    GpuModel(
        key="B300-288GB",
        nvml_name="NVIDIA B300 SXM6 AC",  # not verified
        architecture="blackwell",
        nvml_architecture=ARCH_BLACKWELL,
        cuda_compute_capability=(10, 3),
        sm_count=160,
        memory_bytes=274_021
        * MIB,  # B200's NVML total scaled by the 7g profile sizes (269/180); not verified
        memory_bandwidth_bytes_per_second=8_000_000_000_000,
        power_limit_watts=1100,
        idle_power_watts=150,  # not verified
        pcie_generation=6,
        pcie_width=16,
        nvlink_links=18,
        pci_device_id=0x318210DE,
        max_sm_clock_mhz=1965,  # B200's; not verified
        max_memory_clock_mhz=3996,  # B200's; not verified
        compute_slices=7,
        memory_slices=8,
        gpm_supported=True,
        # B200's per-slice SMs scaled to 160; not verified
        mig_profiles=_profiles_7(
            _MIG_B300, _usable(_MIG_B300), {k: v * 160 // 148 for k, v in _B200_SMS.items()}
        ),
    ),
)


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="A100-SXM4-40GB",
            nvml_name="NVIDIA A100-SXM4-40GB",
            architecture="ampere",
            nvml_architecture=ARCH_AMPERE,
            cuda_compute_capability=(8, 0),
            sm_count=108,
            memory_bytes=40960 * MIB,
            memory_bandwidth_bytes_per_second=1_555_000_000_000,
            power_limit_watts=400,
            idle_power_watts=55,
            pcie_generation=4,
            pcie_width=16,
            nvlink_links=12,
            pci_device_id=0x20B010DE,
            max_sm_clock_mhz=1410,
            max_memory_clock_mhz=1215,
            compute_slices=7,
            memory_slices=8,
            mig_profiles=_profiles_7(
                {"1g": 5, "1g2": 10, "2g": 10, "3g": 20, "4g": 20, "7g": 40},
                {"1g": 4864, "1g2": 9856, "2g": 9856, "3g": 20096, "4g": 20096, "7g": 40320},
                _A100_SMS,
            ),
        ),
        GpuModel(
            key="A100-80GB",
            nvml_name="NVIDIA A100-SXM4-80GB",
            architecture="ampere",
            nvml_architecture=ARCH_AMPERE,
            cuda_compute_capability=(8, 0),
            sm_count=108,
            memory_bytes=81920 * MIB,
            memory_bandwidth_bytes_per_second=2_039_000_000_000,
            power_limit_watts=400,
            idle_power_watts=60,
            pcie_generation=4,
            pcie_width=16,
            nvlink_links=12,
            pci_device_id=0x20B210DE,
            max_sm_clock_mhz=1410,
            max_memory_clock_mhz=1593,
            compute_slices=7,
            memory_slices=8,
            mig_profiles=_profiles_7(
                {"1g": 10, "1g2": 20, "2g": 20, "3g": 40, "4g": 40, "7g": 80},
                {"1g": 9728, "1g2": 19968, "2g": 19968, "3g": 40192, "4g": 40192, "7g": 80384},
                _A100_SMS,
            ),
        ),
        GpuModel(
            key="A30-24GB",
            nvml_name="NVIDIA A30",
            architecture="ampere",
            nvml_architecture=ARCH_AMPERE,
            cuda_compute_capability=(8, 0),
            sm_count=56,
            memory_bytes=24576 * MIB,
            memory_bandwidth_bytes_per_second=933_000_000_000,
            power_limit_watts=165,
            idle_power_watts=30,
            pcie_generation=4,
            pcie_width=16,
            nvlink_links=4,
            pci_device_id=0x20B710DE,
            max_sm_clock_mhz=1440,
            max_memory_clock_mhz=1215,
            compute_slices=4,
            memory_slices=4,
            mig_profiles=_A30_PROFILES,
            has_fan=False,
        ),
        GpuModel(
            key="H100-80GB",
            nvml_name="NVIDIA H100 80GB HBM3",
            architecture="hopper",
            nvml_architecture=ARCH_HOPPER,
            cuda_compute_capability=(9, 0),
            sm_count=132,
            memory_bytes=81559 * MIB,
            memory_bandwidth_bytes_per_second=3_350_000_000_000,
            power_limit_watts=700,
            idle_power_watts=70,
            pcie_generation=5,
            pcie_width=16,
            nvlink_links=18,
            pci_device_id=0x233010DE,
            max_sm_clock_mhz=1980,
            max_memory_clock_mhz=2619,
            compute_slices=7,
            memory_slices=8,
            gpm_supported=True,
            mig_profiles=_profiles_7(
                {"1g": 10, "1g2": 20, "2g": 20, "3g": 40, "4g": 40, "7g": 80},
                {"1g": 9984, "1g2": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
                _HOPPER_SMS,
            ),
        ),
        GpuModel(
            key="H100-94GB-NVL",
            nvml_name="NVIDIA H100 NVL",
            architecture="hopper",
            nvml_architecture=ARCH_HOPPER,
            cuda_compute_capability=(9, 0),
            sm_count=132,
            memory_bytes=95830 * MIB,
            memory_bandwidth_bytes_per_second=3_900_000_000_000,
            power_limit_watts=400,
            idle_power_watts=60,
            pcie_generation=5,
            pcie_width=16,
            nvlink_links=12,
            pci_device_id=0x232110DE,
            max_sm_clock_mhz=1785,
            max_memory_clock_mhz=2619,
            compute_slices=7,
            memory_slices=8,
            gpm_supported=True,
            has_fan=False,
            mig_profiles=_profiles_7(
                {"1g": 12, "1g2": 24, "2g": 24, "3g": 47, "4g": 47, "7g": 94},
                {"1g": 11008, "1g2": 22016, "2g": 22016, "3g": 44032, "4g": 44032, "7g": 88576},
                _HOPPER_SMS,
            ),
        ),
        GpuModel(
            key="H200-141GB",
            nvml_name="NVIDIA H200",
            architecture="hopper",
            nvml_architecture=ARCH_HOPPER,
            cuda_compute_capability=(9, 0),
            sm_count=132,
            memory_bytes=143771 * MIB,
            memory_bandwidth_bytes_per_second=4_800_000_000_000,
            power_limit_watts=700,
            idle_power_watts=75,
            pcie_generation=5,
            pcie_width=16,
            nvlink_links=18,
            pci_device_id=0x233510DE,
            max_sm_clock_mhz=1980,
            max_memory_clock_mhz=3201,
            compute_slices=7,
            memory_slices=8,
            gpm_supported=True,
            memory_reserved_bytes=644939776,  # 615.06 MiB: a real H200, driver 580.159.04
            mig_profiles=_profiles_7(
                {"1g": 18, "1g2": 35, "2g": 35, "3g": 71, "4g": 71, "7g": 141},
                {"1g": 16384, "1g2": 33280, "2g": 33280, "3g": 66816, "4g": 66816, "7g": 143360},
                _HOPPER_SMS,
            ),
        ),
        GpuModel(
            key="B200-180GB",
            nvml_name="NVIDIA B200",
            architecture="blackwell",
            nvml_architecture=ARCH_BLACKWELL,
            cuda_compute_capability=(10, 0),
            sm_count=148,
            memory_bytes=183359 * MIB,
            memory_bandwidth_bytes_per_second=8_000_000_000_000,
            power_limit_watts=1000,
            idle_power_watts=120,
            pcie_generation=6,
            pcie_width=16,
            nvlink_links=18,
            pci_device_id=0x290110DE,
            max_sm_clock_mhz=1965,
            max_memory_clock_mhz=3996,
            compute_slices=7,
            memory_slices=8,
            gpm_supported=True,
            mig_profiles=_profiles_7(
                {"1g": 23, "1g2": 45, "2g": 45, "3g": 90, "4g": 90, "7g": 180},
                {"1g": 22784, "1g2": 45824, "2g": 45824, "3g": 91904, "4g": 91904, "7g": 182784},
                _B200_SMS,
            ),
        ),
        *_MORE,
    )
}

# common spellings accepted wherever a model is named by a person (scenario files, CLI flags)
_ALIASES = {
    "A100-40GB": "A100-SXM4-40GB",
    "A100": "A100-SXM4-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A30": "A30-24GB",
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-NVL": "H100-94GB-NVL",
    "H100-94GB": "H100-94GB-NVL",
    "H200": "H200-141GB",
    "B200": "B200-180GB",
    "T4": "T4-16GB",
    "V100": "V100-SXM2-16GB",
    "V100-16GB": "V100-SXM2-16GB",
    "V100-32GB": "V100-SXM2-32GB",
    "V100-PCIE": "V100-PCIE-16GB",
    "A10": "A10-24GB",
    "A10G": "A10G-24GB",
    "A40": "A40-48GB",
    "L4": "L4-24GB",
    "L40S": "L40S-48GB",
    "RTX6000-ADA": "RTX6000-ADA-48GB",
    "RTX-6000-ADA": "RTX6000-ADA-48GB",
    "H100-PCIE": "H100-PCIE-80GB",
    "H20": "H20-96GB",
    "GH200": "GH200-96GB",
    "GH200-144G": "GH200-144GB",
    "B300": "B300-288GB",
}


@cache
def _names() -> dict[str, GpuModel]:
    """Every name `get_model` takes, lower-cased: catalog keys and NVML names in catalog order,
    then aliases (the first to claim a name keeps it)."""
    out: dict[str, GpuModel] = {}
    for key, model in MODELS.items():
        out.setdefault(key.lower(), model)
        out.setdefault(model.nvml_name.lower(), model)
    for alias, key in _ALIASES.items():
        out.setdefault(alias.lower(), MODELS[key])
    return out


def get_model(name: str) -> GpuModel:
    """Look a model up by catalog key, alias or NVML name (case-insensitive).

    One dict lookup: the analyzer asks ~80,000 times for 10,000 jobs (a scan of the catalog
    each time cost ~0.3 s)."""
    model = _names().get(name.strip().lower())
    if model is None:
        raise CatalogError(f"unknown GPU model {name!r}; known: {', '.join(MODELS)}")
    return model


def model_for_pci_device_id(pci_device_id: int) -> GpuModel | None:
    """The catalog model with this `nvmlPciInfo_t.pciDeviceId` (how mig-parted's `device-filter`
    names GPUs), or None."""
    return next((m for m in MODELS.values() if m.pci_device_id == pci_device_id), None)


def model_for_nvml_name(nvml_name: str) -> GpuModel | None:
    """The catalog model for a name NVML reported, or None for models gpulens does not know."""
    try:
        return get_model(nvml_name)
    except CatalogError:
        return None
