"""Node / GPU detail: everything one node's GPUs report, one panel per USE question.

Pick a node, then one or more GPUs (the fleet overview links here with both set). Utilization and
profiling activity, memory, power against the enforced limit, temperatures, clocks with the reasons
they are held down, ECC / row remapping / Xid, NVLink and PCIe. Device-wide values come from the
parent GPU series only, so nothing is double counted on MIG GPUs. Jobs link to the Jobs dashboard.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from gpulens.dashboards import queries as q
from gpulens.dashboards.common import (
    ANY_IS_BAD,
    BYTES,
    BYTES_PER_SECOND,
    CELSIUS,
    COUNT,
    EVENTS_PER_MINUTE,
    HERTZ,
    IDLE_LOW,
    NONE,
    PERCENTUNIT,
    RATIO_HIGH,
    TEMPERATURE,
    TIMESTAMP,
    UID_NODE,
    UID_SHARING,
    UP,
    WATT,
    Layout,
    column_links,
    column_unit,
    dashboard,
    dashed_series,
    data_link,
    gpu_link,
    gpu_variable,
    job_link,
    node_variable,
    scope_variables,
    stat,
    table,
    timeseries,
)
from gpulens.dashboards.queries import sel

LEGEND = "GPU {{gpu}}"
BY_GPU = "sum by (instance, gpu)"
AGGREGATE = 'scope="aggregate"'
VOLATILE = 'scope="volatile"'
UNCORRECTED = 'error="uncorrected"'
CORRECTED = 'error="corrected"'


def _overview(layout: Layout) -> None:
    layout.row("GPUs on this node")
    layout.add(
        table(
            "GPUs",
            [
                (f"max by (instance, gpu, uuid, model, mig_mode, driver_version) ({sel('gpu_info')})", ""),
                (f"max by (instance, gpu) ({q.activity()})", ""),
                (f"max by (instance, gpu) ({q.memory_used_ratio()})", ""),
                (f"max by (instance, gpu) ({sel('gpu_power_watts')})", ""),
                (f"max by (instance, gpu) ({sel('gpu_temperature_celsius')})", ""),
                (f"max by (instance, gpu) ({sel('gpu_up')})", ""),
            ],
            NONE,
            merge=True,
            hide=("Time", "Value #A"),
            rename={
                "Value #B": "SM activity",
                "Value #C": "memory used",
                "Value #D": "power",
                "Value #E": "temperature",
                "Value #F": "up",
            },
            order=("instance", "gpu", "model", "uuid", "mig_mode", "driver_version"),
            overrides=[
                column_links("gpu", gpu_link("${__data.fields.instance}", "${__data.fields.gpu}")),
                column_links(
                    "mig_mode",
                    data_link(
                        "MIG layout",
                        UID_SHARING,
                        node="${__data.fields.instance}",
                        gpu="${__data.fields.gpu}",
                    ),
                ),
                column_unit("SM activity", PERCENTUNIT),
                column_unit("memory used", PERCENTUNIT),
                column_unit("power", WATT),
                column_unit("temperature", CELSIUS),
            ],
            description="Click a GPU index to narrow this dashboard to it; MIG mode links to its layout.",
        ),
        w=24,
        h=7,
    )
    layout.add(
        table(
            "Jobs on these GPUs",
            [(sel("gpu_job_info"), "")],
            NONE,
            hide=("Time", "__name__", "job", "Value"),
            order=("job_id", "instance", "gpu", "gpu_instance", "sharing", "job_source", "job_user"),
            overrides=[column_links("job_id", job_link("${__data.fields.job_id}"))],
            description="Attributed jobs (`gpu_job_info`); click a job for its GPUs, usage and "
            "recommendation.",
        ),
        w=24,
        h=6,
    )


def _utilization(layout: Layout) -> None:
    layout.row("Utilization and profiling activity")
    layout.add(
        timeseries(
            "GPU utilization (NVML)",
            [(sel("gpu_utilization_ratio"), LEGEND)],
            PERCENTUNIT,
            thresholds=IDLE_LOW,
            description="Fraction of time a kernel ran (coarse: one tiny kernel reads as busy). NVML "
            "does not report it for MIG GPUs; use SM activity there.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "SM activity",
            [(sel("gpu_sm_active_ratio"), LEGEND)],
            PERCENTUNIT,
            thresholds=IDLE_LOW,
            description="Fraction of cycles with at least one warp on an SM (GPM / DCGM), whole GPU.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "SM occupancy",
            [(sel("gpu_sm_occupancy_ratio"), LEGEND)],
            PERCENTUNIT,
            description="Resident warps relative to the maximum, averaged over SMs.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Tensor pipe active",
            [(sel("gpu_tensor_active_ratio"), LEGEND)],
            PERCENTUNIT,
            description="Fraction of cycles the tensor (HMMA) pipes were active.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "DRAM bandwidth active",
            [(sel("gpu_dram_active_ratio"), LEGEND)],
            PERCENTUNIT,
            description="Fraction of cycles the device memory interface was busy.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "FP64 / FP32 / FP16 pipes active",
            [
                (sel("gpu_fp64_active_ratio"), "GPU {{gpu}} fp64"),
                (sel("gpu_fp32_active_ratio"), "GPU {{gpu}} fp32"),
                (sel("gpu_fp16_active_ratio"), "GPU {{gpu}} fp16"),
            ],
            PERCENTUNIT,
            description="Share of cycles the FP64, FP32 and FP16 pipes were busy (GPM or DCGM profiling); "
            "empty without a profiling source.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Processes",
            [(sel("gpu_processes"), LEGEND)],
            COUNT,
            description="Compute and graphics processes on the GPU, all MIG instances included.",
        ),
        w=12,
        h=8,
    )


def _memory(layout: Layout) -> None:
    layout.row("Memory")
    layout.add(
        timeseries(
            "Memory used",
            [
                (sel("gpu_memory_used_bytes"), "GPU {{gpu}} used"),
                (sel("gpu_memory_total_bytes"), "GPU {{gpu}} total"),
            ],
            BYTES,
            overrides=[dashed_series(".* total")],
            description="Used (excluding driver-reserved memory) against the GPU's total.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory used / total",
            [(q.memory_used_ratio(), LEGEND)],
            PERCENTUNIT,
            thresholds=RATIO_HIGH,
            description="Device memory used as a share of the GPU's total "
            "(instance_gpu:gpu_memory_used:ratio); orange at 80 %, red at 95 %.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Memory controller busy (NVML)",
            [(sel("gpu_memory_utilization_ratio"), LEGEND)],
            PERCENTUNIT,
            description="Fraction of time device memory was read or written (absent on MIG GPUs).",
        ),
        w=8,
        h=8,
    )


def _power_thermal(layout: Layout) -> None:
    layout.row("Power, temperature, clocks")
    layout.add(
        timeseries(
            "Power vs limit",
            [
                (sel("gpu_power_watts"), "GPU {{gpu}} draw"),
                (sel("gpu_power_limit_watts"), "GPU {{gpu}} limit"),
            ],
            WATT,
            overrides=[dashed_series(".* limit")],
            description="Board power from the parent GPU (MIG instances have no power of their own).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Power / limit",
            [(f"{sel('gpu_power_watts')} / {sel('gpu_power_limit_watts')}", LEGEND)],
            PERCENTUNIT,
            thresholds=RATIO_HIGH,
            description="Close to 1 the driver caps clocks (see sw_power_cap below).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Temperatures",
            [
                (sel("gpu_temperature_celsius"), "GPU {{gpu}} core"),
                (sel("gpu_memory_temperature_celsius"), "GPU {{gpu}} memory"),
            ],
            CELSIUS,
            thresholds=TEMPERATURE,
            description="GPU core and HBM temperatures; H100 starts slowing down near 87 °C (red line), 83 "
            "°C is the warning line.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Clocks",
            [
                (sel("gpu_sm_clock_hertz"), "GPU {{gpu}} SM"),
                (sel("gpu_memory_clock_hertz"), "GPU {{gpu}} memory"),
                (f"max by (instance) ({sel('gpu_sm_clock_max_hertz')})", "SM max"),
            ],
            HERTZ,
            description="SM and memory clocks, with the node's maximum SM clock dashed: a clock well below "
            "it under load points at throttling (see the throttle reasons).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Clock event reasons (throttling)",
            [(f"sum by (reason) ({sel('gpu_clock_event_active')})", "{{reason}}")],
            COUNT,
            stack=True,
            bars=True,
            description="How many of the selected GPUs have each clock event reason active. gpu_idle "
            "is benign; sw_power_cap, hw_slowdown and the thermal reasons cost performance.",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Performance state",
            [(sel("gpu_performance_state"), LEGEND)],
            NONE,
            description="P-state: 0 is maximum performance, 8 and above idle.",
        ),
        w=12,
        h=8,
    )


def _health(layout: Layout) -> None:
    layout.row("Errors: ECC, row remapping, Xid")
    layout.add(
        stat(
            "GPU up",
            [(f"min({sel('gpu_up')})", "")],
            NONE,
            thresholds=UP,
            color_mode="background",
            description="0 when any selected GPU is lost, unreadable or its NVML calls time out.",
        ),
        w=4,
        h=8,
    )
    layout.add(
        timeseries(
            "ECC errors (rate)",
            [
                (
                    f"60 * sum by (instance, gpu, error) (rate({sel('gpu_ecc_errors_total', VOLATILE)}"
                    "[$__rate_interval]))",
                    "GPU {{gpu}} {{error}}",
                )
            ],
            EVENTS_PER_MINUTE,
            description="Volatile (since driver load) ECC error counters, per minute.",
        ),
        w=10,
        h=8,
    )
    layout.add(
        table(
            "ECC and row remapping totals",
            [
                (f"{BY_GPU} ({sel('gpu_ecc_errors_total', AGGREGATE, UNCORRECTED)})", ""),
                (f"{BY_GPU} ({sel('gpu_ecc_errors_total', AGGREGATE, CORRECTED)})", ""),
                (f"{BY_GPU} ({sel('gpu_remapped_rows_total')})", ""),
                (f"max by (instance, gpu) ({sel('gpu_row_remap_pending')})", ""),
                (f"max by (instance, gpu) ({sel('gpu_row_remap_failed')})", ""),
            ],
            COUNT,
            merge=True,
            thresholds=ANY_IS_BAD,
            rename={
                "Value #A": "ECC uncorrected (aggregate)",
                "Value #B": "ECC corrected (aggregate)",
                "Value #C": "rows remapped",
                "Value #D": "remap pending",
                "Value #E": "remap failed",
            },
            order=("instance", "gpu"),
            description="Lifetime counts. Row remapping is not readable while MIG instances exist, so "
            "those columns are empty for MIG GPUs. Pending needs a GPU reset; failed means RMA.",
        ),
        w=10,
        h=8,
    )
    layout.add(
        timeseries(
            "Xid events (per 10 min)",
            [(f"sum by (gpu, xid) ({sel(q.XID_RECENT)})", "GPU {{gpu}} Xid {{xid}}")],
            COUNT,
            description="Xid events in the preceding 10 minutes by GPU and code (recording rule over the "
            "NVML event counter; a code's first event included).",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Last Xid per GPU and code",
            [(f"max by (instance, gpu, xid) ({sel('gpu_xid_last_timestamp_seconds')}) * 1000", "")],
            TIMESTAMP,
            rename={"Value": "last seen"},
            sort_by="last seen",
            description="When each GPU last reported each Xid code (gpu_xid_last_timestamp_seconds); empty "
            "until a GPU reports its first Xid.",
        ),
        w=12,
        h=8,
    )


def _interconnect(layout: Layout) -> None:
    layout.row("NVLink and PCIe")
    layout.add(
        timeseries(
            "NVLink throughput",
            [
                (f"{BY_GPU} (rate({sel('gpu_nvlink_tx_bytes_total')}[$__rate_interval]))", "GPU {{gpu}} tx"),
                (f"{BY_GPU} (rate({sel('gpu_nvlink_rx_bytes_total')}[$__rate_interval]))", "GPU {{gpu}} rx"),
            ],
            BYTES_PER_SECOND,
            description="Bytes per second sent (tx) and received (rx) over all NVLink links of each GPU.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink links up",
            [(f"{BY_GPU} ({sel('gpu_nvlink_link_up')})", LEGEND)],
            COUNT,
            description="NVLink links in the up state per GPU; a drop from the GPU's usual count is a "
            "failed or degraded link.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink errors",
            [
                (
                    f"60 * sum by (gpu, kind) (rate({sel('gpu_nvlink_errors_total')}[$__rate_interval]))",
                    "GPU {{gpu}} {{kind}}",
                )
            ],
            EVENTS_PER_MINUTE,
            description="Replay, recovery and CRC error counters per minute, all links of a GPU together.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "PCIe throughput",
            [
                (f"rate({sel('gpu_pcie_tx_bytes_total')}[$__rate_interval])", "GPU {{gpu}} tx"),
                (f"rate({sel('gpu_pcie_rx_bytes_total')}[$__rate_interval])", "GPU {{gpu}} rx"),
            ],
            BYTES_PER_SECOND,
            description="Bytes per second over PCIe to (tx) and from (rx) each GPU.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "PCIe replays",
            [(f"60 * rate({sel('gpu_pcie_replays_total')}[$__rate_interval])", LEGEND)],
            EVENTS_PER_MINUTE,
            description="Link-level retransmissions per minute; a steady rate points at a bad riser or slot.",
        ),
        w=8,
        h=8,
    )
    layout.add(
        table(
            "PCIe link",
            [
                (f"max by (instance, gpu) ({sel('gpu_pcie_link_generation')})", ""),
                (f"max by (instance, gpu) ({sel('gpu_pcie_link_width')})", ""),
            ],
            NONE,
            merge=True,
            rename={"Value #A": "generation", "Value #B": "width (lanes)"},
            order=("instance", "gpu"),
            description="Current link generation and width (a downtrained link shows here).",
        ),
        w=8,
        h=8,
    )


def build() -> Dashboard:
    layout = Layout()
    _overview(layout)
    _utilization(layout)
    _memory(layout)
    _power_thermal(layout)
    _health(layout)
    _interconnect(layout)
    return dashboard(
        UID_NODE,
        "gpulens: one node's GPUs in detail (utilization, memory, power, thermals, clocks, errors, links).",
        layout,
        [*scope_variables(), node_variable(multi=False), gpu_variable()],
        time_from="now-3h",
    )
