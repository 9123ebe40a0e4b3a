/*
 * The shared-memory layout between the simulation engine's publisher (Python,
 * gpulens/sim/native/layout.py mirrors every struct below with ctypes) and the
 * simulated libnvidia-ml.so.1 (simnvml.c), which only reads it.
 *
 * One file, mapped by both processes: a header, then `gpu_count` GpuRec, then a
 * ring of EventRec, then the ProcRec table. Everything after `seq` is written
 * under a seqlock: the writer makes `seq` odd, copies the new body in, makes it
 * even again; a reader copies the body and retries when `seq` was odd or moved.
 * Natural alignment, the host's byte order (both sides run on the same host).
 * Bump LAYOUT_VERSION on any change: the library refuses a different one.
 */
#ifndef GPULENS_SIM_LAYOUT_H
#define GPULENS_SIM_LAYOUT_H

#include <stdint.h>

#define LAYOUT_MAGIC "GLSNVML"
#define LAYOUT_VERSION 2u

#define MAX_GPUS 64
#define MAX_MIG 8           /* MIG devices per GPU (7 compute slices at most) */
#define MAX_NVLINKS 18
#define MAX_PROFILES 18     /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define MAX_RETIRED 16      /* retired pages per cause */
#define N_LOCATIONS 8       /* NVML_MEMORY_LOCATION_L1 .. SRAM */
#define N_REASON_BITS 16    /* clock event reason bit -> cumulative ns */
#define N_NVLINK_COUNTERS 5 /* NVML_NVLINK_ERROR_DL_REPLAY .. ECC_DATA */
#define N_ACTIVITY 13       /* see ACT_* */
#define UTIL_SAMPLES 16     /* GPU utilization samples kept (engine.UTILIZATION_SAMPLES) */

/* activity integrals (fraction-seconds, or bytes for the rates) */
enum {
    ACT_GRAPHICS, ACT_SM, ACT_SM_OCCUPANCY, ACT_TENSOR, ACT_DRAM, ACT_FP64, ACT_FP32, ACT_FP16,
    ACT_INTEGER, ACT_PCIE_TX, ACT_PCIE_RX, ACT_NVLINK_TX, ACT_NVLINK_RX
};

/* ProcRec.kind */
enum { PROC_COMPUTE = 0, PROC_GRAPHICS = 1, PROC_MPS_SERVER = 2, PROC_MPS_CLIENT = 3 };

typedef struct {
    char magic[8];          /* LAYOUT_MAGIC */
    uint32_t layout_version;
    uint32_t header_size;   /* sizeof(ShmHeader) */
    uint64_t seq;           /* seqlock: odd while the body is being written */
    uint64_t capacity;      /* bytes of the file */
    /* --- the body: written under the seqlock ------------------------------------- */
    uint64_t used_size;     /* bytes from offset 0 that hold data (header included) */
    double sim_time;        /* simulated epoch seconds at the publish */
    double speed;           /* simulated seconds per real second; 0: time stands still */
    int64_t mono_ns;        /* CLOCK_MONOTONIC at the publish */
    uint64_t events_total;  /* events ever published; the ring holds the last event_ring */
    uint64_t gpu_offset;
    uint64_t event_offset;
    uint64_t proc_offset;
    int32_t init_error;     /* 0, or the NVML error code nvmlInit fails with now */
    int32_t cuda_driver_version;
    uint32_t gpu_count;
    uint32_t event_ring;    /* slots in the ring */
    uint32_t proc_count;    /* ProcRec in use */
    uint32_t proc_capacity;
    char driver_version[32];
    char nvml_version[32];
} ShmHeader;

typedef struct {
    double time;            /* simulated epoch seconds */
    uint64_t event_type;
    uint64_t data;
    uint32_t gpu;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t pad;
} EventRec;

typedef struct {
    uint64_t used_memory;   /* bytes; meaningless when !memory_known */
    double start_time;      /* simulated epoch seconds */
    uint32_t pid;
    uint32_t kind;          /* PROC_* */
    uint32_t memory_known;
    uint32_t sm_util;
    uint32_t mem_util;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t pad;
    char name[32];
} ProcRec;

typedef struct {
    uint64_t tx_kib;
    uint64_t rx_kib;
    uint64_t errors[N_NVLINK_COUNTERS];
    uint32_t link;
    uint32_t active;
} NvLinkRec;

typedef struct {
    uint64_t memory_mb;
    uint32_t valid;
    uint32_t id;
    uint32_t slices;
    uint32_t instances;
    uint32_t sm_count;
    uint32_t copy, decoder, encoder, jpeg, ofa;
    char name[32];          /* "MIG 1g.10gb" */
} ProfileRec;

typedef struct {
    double activity[N_ACTIVITY];   /* integrals since the publisher started */
    uint64_t memory_total;
    uint64_t memory_used;
    uint64_t memory_reserved;
    uint32_t slot;
    uint32_t gpu_instance_id;
    uint32_t compute_instance_id;
    uint32_t placement_start;
    uint32_t sm_count;
    uint32_t slices;
    uint32_t copy, decoder, encoder, jpeg, ofa;
    uint32_t proc_first, proc_count;     /* its processes */
    uint32_t client_first, client_count; /* its MPS clients */
    uint32_t pad;
    char uuid[80];
    char profile[16];       /* "1g.10gb" */
} MigRec;

typedef struct {
    /* activity integrals of the whole GPU, and the simulated time they were taken at */
    double activity[N_ACTIVITY];
    double activity_time;
    double hang_until;      /* simulated time until which a call on this GPU blocks */
    /* the GPU utilization samples the driver keeps (nvmlDeviceGetSamples), oldest first */
    uint64_t util_sample_us[UTIL_SAMPLES];   /* end of each sample's period, simulated epoch µs */
    uint32_t util_sample_pct[UTIL_SAMPLES];
    uint32_t util_sample_count;
    uint32_t util_sample_pad;
    /* identity and model */
    uint32_t index;
    uint32_t minor_number;
    uint32_t pci_domain, pci_bus, pci_device, pci_function;
    uint32_t pci_ok;        /* the bus id parsed */
    uint32_t pci_device_id;
    uint32_t architecture;
    int32_t cc_major, cc_minor;
    uint32_t sm_count;
    uint32_t model_power_limit_mw;
    uint32_t max_sm_clock, max_mem_clock;
    uint32_t max_pcie_gen, max_pcie_width;
    uint32_t model_nvlinks;
    uint32_t ecc_default;
    uint32_t mig_capable;
    uint32_t compute_slices;
    uint32_t gpm_supported;
    uint32_t has_serial;
    /* state */
    uint32_t lost;
    uint32_t util_gpu, util_mem;
    uint32_t temperature;
    int32_t memory_temperature;  /* -1: NOT_SUPPORTED */
    uint32_t power_mw, power_limit_mw, default_power_limit_mw;
    uint32_t clock_graphics, clock_sm, clock_mem, clock_video;
    int32_t fan_percent;         /* -1: no fan */
    uint32_t pstate, compute_mode, persistence;
    uint32_t pcie_tx_kbps, pcie_rx_kbps, pcie_replay, pcie_gen, pcie_width;
    int32_t ecc_enabled;         /* -1: no ECC */
    int32_t remap_supported;
    uint32_t remap[4];           /* correctable, uncorrectable, pending, failure */
    int32_t retired_supported;
    uint32_t retired_pending;
    uint32_t retired_count[2];
    int32_t mig_current, mig_pending;  /* -1: MIG not supported */
    uint32_t accounting;
    uint32_t nvlink_count;
    uint32_t mig_count;
    uint32_t proc_first, proc_count;
    uint32_t client_first, client_count;
    uint32_t pad;
    uint64_t memory_total, memory_reserved, memory_used;
    uint64_t bar1_total, bar1_used;
    uint64_t energy_mj;
    uint64_t clock_event_reasons, supported_clock_event_reasons;
    uint64_t clock_reason_ns[N_REASON_BITS];
    uint64_t pcie_tx_bytes, pcie_rx_bytes;
    uint64_t ecc_totals[2][2];                 /* [error type][counter type] */
    uint64_t memory_errors[2][2][N_LOCATIONS]; /* [error type][counter type][location] */
    uint64_t retired_address[2][MAX_RETIRED];
    uint64_t retired_time_us[2][MAX_RETIRED];
    NvLinkRec nvlinks[MAX_NVLINKS];
    MigRec mig[MAX_MIG];
    ProfileRec profiles[MAX_PROFILES];        /* by NVML GPU-instance profile id */
    char name[96];
    char uuid[80];
    char serial[32];
    char pci_bus_id[32];      /* "00000000:18:00.0" */
    char pci_bus_id_legacy[16];
    char board_part_number[32];
    char vbios_version[32];
} GpuRec;

#endif
