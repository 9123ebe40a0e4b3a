/*
 * A simulated libnvidia-ml.so.1.
 *
 * It implements the NVML C functions that gpulens-exporter, nvitop and nvitop-exporter call,
 * answering from the state the simulation engine publishes into a shared-memory file (layout.h),
 * named by the GPULENS_SIM_SHM environment variable. Programs find it through the dynamic
 * loader's normal search (LD_LIBRARY_PATH), so Python's pynvml and compiled programs alike load it
 * as "libnvidia-ml.so.1". Behaviours mirror gpulens/sim/nvml/ (the Python reference driver) one
 * for one; the shared probe suite in tests/sim runs against both.
 *
 * Reading: every call takes a consistent copy of the published state (seqlock) into a buffer of
 * its own thread, refreshed only when the publisher wrote something new, and answers from it.
 * Blocking (a hanging GPU, nvmlEventSetWait) happens here, in C: ctypes has released the GIL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "layout.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum {
    SUCCESS = 0, E_UNINITIALIZED = 1, E_INVALID_ARGUMENT = 2, E_NOT_SUPPORTED = 3,
    E_NO_PERMISSION = 4, E_NOT_FOUND = 6, E_INSUFFICIENT_SIZE = 7, E_DRIVER_NOT_LOADED = 9,
    E_TIMEOUT = 10, E_GPU_IS_LOST = 15, E_LIB_RM_VERSION_MISMATCH = 18, E_ARGUMENT_VERSION_MISMATCH = 25, E_UNKNOWN = 999
};

#define VERSIONED(size, v) ((unsigned)(size) | ((unsigned)(v) << 24))
#define NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull
#define NO_INSTANCE 0xFFFFFFFFu
#define ALL_LINKS 0xFFFFFFFFu
#define HANDLE_STRIDE 64
#define MIB (1024.0 * 1024.0)
#define FI_MAX 308
#define GPM_METRIC_MAX 477
/* A waiting nvmlEventSetWait sleeps on a futex in the shared mapping that the publisher wakes when
 * it publishes events, as a real driver's wait sleeps until an interrupt: polling woke the waiting
 * thread 10-50 times a second, which cost an idle Xid watcher ~1-2.5 ms of CPU per second on a
 * virtual machine, all of it simulator, charged to the exporter by `make bench`. EVENT_POLL_NS is
 * the longest sleep between looks (a net for a missed wake-up) and the poll interval where the
 * kernel refuses the futex. */
#define EVENT_POLL_NS 1000000000L

/* ---------------------------------------------------------------------------------------------
 * The mapping and the per-thread snapshot
 */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* refcount, mapping, objects */
static int g_refcount;
static const unsigned char *g_map;   /* the publisher's file, read-only */
static size_t g_map_size;
static char g_map_path[4096];
static uint64_t g_generation;        /* bumps on every (re)mapping */
static unsigned char g_handles[MAX_GPUS * HANDLE_STRIDE]; /* device handles point in here */
static uint64_t g_gpm_streaming; /* GPUs with GPM streaming on, one bit each (under g_lock) */

typedef struct {
    unsigned char *buf;
    size_t cap;
    uint64_t seq;
    uint64_t generation;
} Snapshot;

static pthread_key_t g_snapshot_key;
static pthread_once_t g_snapshot_once = PTHREAD_ONCE_INIT;

static void snapshot_free(void *p) {
    Snapshot *s = p;
    if (s) {
        free(s->buf);
        free(s);
    }
}

static void snapshot_key_init(void) { pthread_key_create(&g_snapshot_key, snapshot_free); }

/* The calling thread's consistent copy of the published state (NULL when not mapped). */
static const ShmHeader *view(void) {
    pthread_once(&g_snapshot_once, snapshot_key_init);
    const unsigned char *map = __atomic_load_n(&g_map, __ATOMIC_ACQUIRE);
    if (!map) return NULL;
    uint64_t generation = __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
    Snapshot *s = pthread_getspecific(g_snapshot_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        pthread_setspecific(g_snapshot_key, s);
    }
    const ShmHeader *shared = (const ShmHeader *)map;
    for (int spins = 0;; spins++) {
        uint64_t seq = __atomic_load_n(&shared->seq, __ATOMIC_ACQUIRE);
        if (s->buf && s->generation == generation && s->seq == seq) return (const ShmHeader *)s->buf;
        if (seq & 1) {
            if (spins > 64) sched_yield();
            continue;
        }
        uint64_t used = __atomic_load_n(&shared->used_size, __ATOMIC_RELAXED);
        if (used < sizeof(ShmHeader) || used > g_map_size) used = g_map_size;
        if (s->cap < g_map_size) {
            unsigned char *grown = realloc(s->buf, g_map_size);
            if (!grown) return NULL;
            s->buf = grown;
            s->cap = g_map_size;
        }
        memcpy(s->buf, map, used);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&shared->seq, __ATOMIC_RELAXED) == seq) {
            s->seq = seq;
            s->generation = generation;
            return (const ShmHeader *)s->buf;
        }
    }
}

static const GpuRec *gpu_rec(const ShmHeader *h, unsigned index) {
    return (const GpuRec *)((const unsigned char *)h + h->gpu_offset) + index;
}

static const ProcRec *procs(const ShmHeader *h) {
    return (const ProcRec *)((const unsigned char *)h + h->proc_offset);
}

static const EventRec *events(const ShmHeader *h) {
    return (const EventRec *)((const unsigned char *)h + h->event_offset);
}

static double monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Simulated time now: the publish time, plus the real time since, at the clock's speed. */
static double sim_now(const ShmHeader *h) {
    if (h->speed <= 0) return h->sim_time;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return h->sim_time + (double)(now_ns - h->mono_ns) / 1e9 * h->speed;
}

static void sleep_seconds(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* Map (or re-map) the file named by GPULENS_SIM_SHM; called under g_lock. */
static nvmlReturn_t attach(void) {
    const char *path = getenv("GPULENS_SIM_SHM");
    if (!path || !*path) {
        fprintf(stderr, "gpulens simulated NVML: GPULENS_SIM_SHM is not set (start the program with "
                        "`gpulens sim run SCENARIO -- ...`)\n");
        return E_DRIVER_NOT_LOADED;
    }
    if (g_map && strcmp(path, g_map_path) == 0) return SUCCESS;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "gpulens simulated NVML: cannot open %s: %s\n", path, strerror(errno));
        return E_DRIVER_NOT_LOADED;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(ShmHeader)) {
        fprintf(stderr, "gpulens simulated NVML: %s is not a published simulated node\n", path);
        close(fd);
        return E_DRIVER_NOT_LOADED;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "gpulens simulated NVML: cannot map %s: %s\n", path, strerror(errno));
        return E_DRIVER_NOT_LOADED;
    }
    const ShmHeader *h = map;
    if (memcmp(h->magic, LAYOUT_MAGIC, sizeof LAYOUT_MAGIC) != 0 || h->layout_version != LAYOUT_VERSION ||
        h->header_size != sizeof(ShmHeader)) {
        fprintf(stderr, "gpulens simulated NVML: %s has layout %u, this library reads %u (rebuild it)\n",
                path, h->layout_version, LAYOUT_VERSION);
        munmap(map, (size_t)st.st_size);
        return E_LIB_RM_VERSION_MISMATCH;
    }
    if (g_map) munmap((void *)g_map, g_map_size);
    g_gpm_streaming = 0; /* a new node: the library's own settings start afresh */
    g_map_size = (size_t)st.st_size;
    snprintf(g_map_path, sizeof g_map_path, "%s", path);
    __atomic_add_fetch(&g_generation, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&g_map, (const unsigned char *)map, __ATOMIC_RELEASE);
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Resolving handles: what a handle points at, with the per-GPU quirks (hang, lost) applied
 */

#define NEED_INIT()                                                         \
    do {                                                                    \
        if (__atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) <= 0) return E_UNINITIALIZED; \
    } while (0)
#define TRY(expr)                       \
    do {                                \
        nvmlReturn_t rc_ = (expr);      \
        if (rc_ != SUCCESS) return rc_; \
    } while (0)
#define OUT(ptr, value)                          \
    do {                                         \
        if (!(ptr)) return E_INVALID_ARGUMENT;   \
        *(ptr) = (value);                        \
    } while (0)

typedef struct {
    const ShmHeader *h;
    const GpuRec *g;
    const MigRec *mig; /* NULL for a physical GPU's handle */
    unsigned index;
} Target;

static nvmlDevice_t gpu_handle(unsigned index) { return &g_handles[index * HANDLE_STRIDE]; }

static nvmlDevice_t mig_handle(unsigned index, unsigned slot) {
    return &g_handles[index * HANDLE_STRIDE + 1 + slot];
}

/* The GPU's state now, after any hang it is in; GPU_IS_LOST if it is lost. */
static nvmlReturn_t gpu_now(unsigned index, const ShmHeader **hp, const GpuRec **gp) {
    const ShmHeader *h = view();
    if (!h) return E_UNINITIALIZED;
    if (index >= h->gpu_count) return E_INVALID_ARGUMENT;
    const GpuRec *g = gpu_rec(h, index);
    double left = g->hang_until - sim_now(h);
    if (left > 0) {
        /* simulated seconds: shorter on a sped-up clock; one real second each when time stands still */
        sleep_seconds(left / (h->speed > 0 ? h->speed : 1.0));
        h = view();
        if (!h) return E_UNINITIALIZED;
        g = gpu_rec(h, index);
    }
    if (g->lost) return E_GPU_IS_LOST;
    *hp = h;
    *gp = g;
    return SUCCESS;
}

static const MigRec *mig_by_slot(const GpuRec *g, unsigned slot) {
    for (unsigned i = 0; i < g->mig_count && i < MAX_MIG; i++)
        if (g->mig[i].slot == slot) return &g->mig[i];
    return NULL;
}

static const MigRec *mig_by_gi(const GpuRec *g, unsigned gi) {
    for (unsigned i = 0; i < g->mig_count && i < MAX_MIG; i++)
        if (g->mig[i].gpu_instance_id == gi) return &g->mig[i];
    return NULL;
}

static nvmlReturn_t device(nvmlDevice_t handle, Target *t) {
    const ShmHeader *h = view();
    if (!h) return E_UNINITIALIZED;
    if (!handle) return E_INVALID_ARGUMENT;
    uintptr_t base = (uintptr_t)g_handles, at = (uintptr_t)handle;
    if (at < base || at - base >= (uintptr_t)h->gpu_count * HANDLE_STRIDE) return E_INVALID_ARGUMENT;
    unsigned index = (unsigned)((at - base) / HANDLE_STRIDE), rest = (unsigned)((at - base) % HANDLE_STRIDE);
    const GpuRec *g;
    TRY(gpu_now(index, &h, &g));
    t->h = h;
    t->g = g;
    t->index = index;
    t->mig = NULL;
    if (rest) {
        t->mig = mig_by_slot(g, rest - 1);
        if (!t->mig || g->mig_current != 1) return E_INVALID_ARGUMENT; /* a stale MIG handle */
    }
    return SUCCESS;
}

static int mig_enabled(const Target *t) { return t->g->mig_current == 1; }

/* The physical GPU has a MIG mode at all (nvmlDeviceGetMigMode answers), on or off. */
static int mig_capable(const Target *t) { return !t->mig && t->g->mig_current >= 0; }

static nvmlReturn_t physical(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    return t->mig ? E_NOT_SUPPORTED : SUCCESS;
}

static nvmlReturn_t out_str(char *buf, unsigned size, const char *text) {
    size_t n = strlen(text) + 1;
    if (n > size) return E_INSUFFICIENT_SIZE;
    if (!buf) return E_INVALID_ARGUMENT;
    memcpy(buf, text, n);
    return SUCCESS;
}

/* NVML's two-call buffer protocol: *count is the capacity in, the entries needed or written out. */
static nvmlReturn_t handshake(unsigned *count, const void *buffer, unsigned items) {
    if (!count) return E_INVALID_ARGUMENT;
    unsigned capacity = *count;
    if (items == 0) {
        *count = 0;
        return SUCCESS;
    }
    if (!buffer || capacity < items) {
        *count = items;
        return E_INSUFFICIENT_SIZE;
    }
    *count = items;
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Init, system, identity
 */

API nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = SUCCESS;
    if (g_refcount == 0) rc = attach();
    if (rc == SUCCESS) {
        const ShmHeader *h = view();
        if (!h) rc = E_UNKNOWN;
        else if (h->init_error) rc = h->init_error;
        else __atomic_add_fetch(&g_refcount, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = SUCCESS;
    if (g_refcount <= 0) rc = E_UNINITIALIZED;
    else __atomic_sub_fetch(&g_refcount, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t code) {
    switch (code) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned size) {
    NEED_INIT();
    return out_str(buf, size, view()->driver_version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned size) {
    NEED_INIT();
    return out_str(buf, size, view()->nvml_version);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *out) {
    NEED_INIT();
    OUT(out, view()->cuda_driver_version);
    return SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *out) { return nvmlSystemGetCudaDriverVersion(out); }

/* The name of a process with a context on some simulated GPU (NOT_FOUND otherwise). */
API nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *buf, unsigned size) {
    NEED_INIT();
    const ShmHeader *h = view();
    const ProcRec *table = procs(h);
    for (unsigned i = 0; i < h->gpu_count; i++) {
        const GpuRec *g = gpu_rec(h, i);
        /* the order the reference driver searches in: GPU processes, MPS clients, then MIG ones */
        unsigned ranges[2 + 2 * MAX_MIG][2];
        unsigned n = 0;
        ranges[n][0] = g->proc_first, ranges[n++][1] = g->proc_count;
        ranges[n][0] = g->client_first, ranges[n++][1] = g->client_count;
        for (unsigned m = 0; m < g->mig_count && m < MAX_MIG; m++)
            ranges[n][0] = g->mig[m].proc_first, ranges[n++][1] = g->mig[m].proc_count;
        for (unsigned m = 0; m < g->mig_count && m < MAX_MIG; m++)
            ranges[n][0] = g->mig[m].client_first, ranges[n++][1] = g->mig[m].client_count;
        for (unsigned r = 0; r < n; r++)
            for (unsigned k = 0; k < ranges[r][1]; k++)
                if (table[ranges[r][0] + k].pid == pid) return out_str(buf, size, table[ranges[r][0] + k].name);
    }
    return E_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *out) {
    NEED_INIT();
    OUT(out, view()->gpu_count);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *out) {
    NEED_INIT();
    const ShmHeader *h = view();
    const GpuRec *g;
    if (index >= h->gpu_count) return E_INVALID_ARGUMENT;
    TRY(gpu_now(index, &h, &g)); /* a lost GPU cannot even be opened */
    OUT(out, gpu_handle(index));
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *out) {
    NEED_INIT();
    if (!uuid || !*uuid) return E_INVALID_ARGUMENT;
    const ShmHeader *h = view();
    const GpuRec *g;
    for (unsigned i = 0; i < h->gpu_count; i++) {
        if (strcmp(gpu_rec(h, i)->uuid, uuid) == 0) {
            TRY(gpu_now(i, &h, &g));
            OUT(out, gpu_handle(i));
            return SUCCESS;
        }
    }
    for (unsigned i = 0; i < h->gpu_count; i++) { /* MIG UUIDs, only while the instance exists */
        const GpuRec *rec = gpu_rec(h, i);
        if (rec->mig_current != 1) continue;
        for (unsigned m = 0; m < rec->mig_count && m < MAX_MIG; m++) {
            if (strcmp(rec->mig[m].uuid, uuid) == 0) {
                unsigned slot = rec->mig[m].slot;
                TRY(gpu_now(i, &h, &g));
                OUT(out, mig_handle(i, slot));
                return SUCCESS;
            }
        }
    }
    return E_NOT_FOUND;
}

/* (domain, bus, device, function) of "00000000:18:00.0", "0000:18:00.0" or "18:00.0". */
static int parse_bus_id(const char *text, unsigned parts[4]) {
    char copy[128];
    if (!text) return 0;
    while (*text == ' ' || *text == '\t' || *text == '\n') text++;
    snprintf(copy, sizeof copy, "%s", text);
    size_t len = strlen(copy);
    while (len && (copy[len - 1] == ' ' || copy[len - 1] == '\t' || copy[len - 1] == '\n')) copy[--len] = 0;
    char *dot = strrchr(copy, '.');
    if (!dot) return 0;
    *dot = 0;
    char *fields[4];
    unsigned n = 0;
    char *rest = copy, *colon;
    while ((colon = strchr(rest, ':')) && n < 3) {
        *colon = 0;
        fields[n++] = rest;
        rest = colon + 1;
    }
    if (n >= 3) return 0;
    fields[n++] = rest;
    fields[n++] = dot + 1;
    unsigned values[4], count = 0;
    if (n == 3) values[count++] = 0; /* no domain */
    else if (n != 4) return 0;
    for (unsigned i = 0; i < n; i++) {
        char *end;
        if (!*fields[i]) return 0;
        unsigned long v = strtoul(fields[i], &end, 16);
        if (*end) return 0;
        values[count++] = (unsigned)v;
    }
    memcpy(parts, values, sizeof values);
    return 1;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *out) {
    NEED_INIT();
    unsigned wanted[4];
    if (!parse_bus_id(bus_id ? bus_id : "", wanted)) return E_INVALID_ARGUMENT;
    const ShmHeader *h = view();
    const GpuRec *g;
    for (unsigned i = 0; i < h->gpu_count; i++) {
        const GpuRec *rec = gpu_rec(h, i);
        if (rec->pci_ok && rec->pci_domain == wanted[0] && rec->pci_bus == wanted[1] &&
            rec->pci_device == wanted[2] && rec->pci_function == wanted[3]) {
            TRY(gpu_now(i, &h, &g));
            OUT(out, gpu_handle(i));
            return SUCCESS;
        }
    }
    return E_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *out) {
    NEED_INIT();
    const ShmHeader *h = view();
    const GpuRec *g;
    for (unsigned i = 0; i < h->gpu_count; i++) {
        const GpuRec *rec = gpu_rec(h, i);
        if (rec->has_serial && rec->serial[0] && strcmp(rec->serial, serial ? serial : "") == 0) {
            TRY(gpu_now(i, &h, &g));
            OUT(out, gpu_handle(i));
            return SUCCESS;
        }
    }
    return E_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *buf, unsigned size) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    char name[160];
    if (t.mig) snprintf(name, sizeof name, "%s MIG %s", t.g->name, t.mig->profile);
    else snprintf(name, sizeof name, "%s", t.g->name);
    return out_str(buf, size, name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *buf, unsigned size) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    return out_str(buf, size, t.mig ? t.mig->uuid : t.g->uuid);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t handle, char *buf, unsigned size) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!t.g->has_serial) return E_NOT_SUPPORTED;
    return out_str(buf, size, t.g->serial);
}

API nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t handle, char *buf, unsigned size) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!t.g->board_part_number[0]) return E_NOT_SUPPORTED;
    return out_str(buf, size, t.g->board_part_number);
}

API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t handle, char *buf, unsigned size) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    return out_str(buf, size, t.g->vbios_version[0] ? t.g->vbios_version : "96.00.00.00.00");
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    OUT(out, t.index);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    OUT(out, t.g->minor_number);
    return SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} PciInfo;

/* MIG devices report their parent's PCI location. */
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t handle, PciInfo *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!t.g->pci_ok) return E_UNKNOWN;
    if (!out) return E_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    memcpy(out->busIdLegacy, t.g->pci_bus_id_legacy, strnlen(t.g->pci_bus_id_legacy, 15));
    memcpy(out->busId, t.g->pci_bus_id, strnlen(t.g->pci_bus_id, 31));
    out->domain = t.g->pci_domain;
    out->bus = t.g->pci_bus;
    out->device = t.g->pci_device;
    out->pciDeviceId = t.g->pci_device_id;
    out->pciSubSystemId = (t.g->pci_device_id & 0xFFFF0000u) | 0x10DEu;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, t.g->architecture);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t handle, int *major, int *minor) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(major, t.g->cc_major);
    OUT(minor, t.g->cc_minor);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, 14u); /* NVML_BRAND_NVIDIA */
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    OUT(out, t.g->sm_count * (t.g->architecture >= 9 ? 128u : 64u));
    return SUCCESS;
}

/* WDDM/TCC driver models exist on Windows only: the Linux driver has the symbol and answers NS. */
API nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t handle, unsigned *current, unsigned *pending) {
    NEED_INIT();
    (void)current, (void)pending;
    Target t;
    TRY(device(handle, &t));
    return E_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t handle, unsigned *current, unsigned *pending) {
    return nvmlDeviceGetDriverModel_v2(handle, current, pending);
}

/* Topology (NUMA node, PCIe common ancestor, P2P status): the shared-memory layout does not carry
 * the scenario's topology, so this driver answers as a driver without the data does (NOT_SUPPORTED)
 * and the exporter leaves the topology families out; the in-process driver (sim/nvml/topology.py)
 * serves them. The symbols exist so both drivers export the same NVML API. */
API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t handle, unsigned *node) {
    NEED_INIT();
    (void)node;
    Target t;
    TRY(physical(handle, &t));
    return E_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    NEED_INIT();
    (void)level;
    Target ta, tb;
    TRY(physical(a, &ta));
    TRY(physical(b, &tb));
    return E_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    NEED_INIT();
    (void)index, (void)status;
    Target ta, tb;
    TRY(physical(a, &ta));
    TRY(physical(b, &tb));
    return E_NOT_SUPPORTED;
}

/* NVLink fabric registration (nvidia-smi's fabric state, read for --compat nvidia_gpu_exporter):
 * the shared-memory layout does not carry it either, so NOT_SUPPORTED as on a GPU outside an
 * NVLink fabric; the in-process driver serves it. */
API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t handle, void *info) {
    NEED_INIT();
    (void)info;
    Target t;
    TRY(physical(handle, &t));
    return E_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------------------------------------
 * Memory and utilization
 */

typedef struct { unsigned long long total, free, used; } Memory;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } Memory_v2;

static void memory_of(const Target *t, uint64_t *total, uint64_t *reserved, uint64_t *used) {
    if (t->mig) *total = t->mig->memory_total, *reserved = t->mig->memory_reserved, *used = t->mig->memory_used;
    else *total = t->g->memory_total, *reserved = t->g->memory_reserved, *used = t->g->memory_used;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, Memory *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    uint64_t total, reserved, used;
    memory_of(&t, &total, &reserved, &used);
    if (!out) return E_INVALID_ARGUMENT;
    out->total = total, out->used = used, out->free = total > used ? total - used : 0;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t handle, Memory_v2 *out) {
    NEED_INIT();
    if (!out) return E_INVALID_ARGUMENT;
    if (out->version != VERSIONED(sizeof(Memory_v2), 2)) return E_ARGUMENT_VERSION_MISMATCH;
    Target t;
    TRY(device(handle, &t));
    uint64_t total, reserved, used;
    memory_of(&t, &total, &reserved, &used);
    /* v1 `used` includes the driver's reserved memory, v2 `used` does not (free is the same in
     * both): a real H200, driver 580. MIG devices keep v1's `used` (no real record of them yet). */
    out->total = total, out->reserved = reserved;
    out->used = t.mig ? used : (used > reserved ? used - reserved : 0);
    out->free = total > used ? total - used : 0;
    return SUCCESS;
}

typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } Bar1Memory;

API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t handle, Bar1Memory *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!out) return E_INVALID_ARGUMENT;
    out->bar1Total = t.g->bar1_total, out->bar1Used = t.g->bar1_used;
    out->bar1Free = t.g->bar1_total > t.g->bar1_used ? t.g->bar1_total - t.g->bar1_used : 0;
    return SUCCESS;
}

/* Utilization counters do not exist on MIG devices, nor on a GPU with MIG mode on. */
static nvmlReturn_t utilization_target(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    return (t->mig || mig_enabled(t)) ? E_NOT_SUPPORTED : SUCCESS;
}

typedef struct { unsigned gpu, memory; } Utilization;

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, Utilization *out) {
    NEED_INIT();
    Target t;
    TRY(utilization_target(handle, &t));
    if (!out) return E_INVALID_ARGUMENT;
    out->gpu = t.g->util_gpu, out->memory = t.g->util_mem;
    return SUCCESS;
}

typedef union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; } SampleValue;
typedef struct { unsigned long long timeStamp; SampleValue sampleValue; } Sample;

/* The GPU utilization samples newer than `last_seen` (0: all kept), oldest first; NULL `samples`:
 * the count that can be queried; else at most `*count`, the oldest first. NOT_FOUND when none is
 * newer; NOT_SUPPORTED on MIG and for sampling types the node does not keep (as sim/nvml). */
API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t handle, unsigned type, unsigned long long last_seen,
                                      unsigned *value_type, unsigned *count, Sample *samples) {
    NEED_INIT();
    if (!count || !value_type) return E_INVALID_ARGUMENT;
    Target t;
    TRY(utilization_target(handle, &t));
    if (type != 1u) return E_NOT_SUPPORTED; /* NVML_GPU_UTILIZATION_SAMPLES */
    unsigned kept = t.g->util_sample_count < UTIL_SAMPLES ? t.g->util_sample_count : UTIL_SAMPLES, first = 0;
    while (first < kept && t.g->util_sample_us[first] <= last_seen) first++;
    if (first == kept) return E_NOT_FOUND;
    *value_type = 1u; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    unsigned n = kept - first;
    if (!samples) {
        *count = n;
        return SUCCESS;
    }
    if (*count == 0) return E_INVALID_ARGUMENT;
    if (n > *count) n = *count;
    for (unsigned i = 0; i < n; i++) {
        samples[i].timeStamp = t.g->util_sample_us[first + i];
        samples[i].sampleValue.ull = 0;
        samples[i].sampleValue.ui = t.g->util_sample_pct[first + i];
    }
    *count = n;
    return SUCCESS;
}

/* Encoder/decoder engines: idle on the simulated node (datacenter training and inference). */
static nvmlReturn_t codec(nvmlDevice_t handle, unsigned *util, unsigned *period) {
    NEED_INIT();
    Target t;
    TRY(utilization_target(handle, &t));
    OUT(util, 0u);
    OUT(period, 167000u);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t handle, unsigned *util, unsigned *period) {
    return codec(handle, util, period);
}

API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t handle, unsigned *util, unsigned *period) {
    return codec(handle, util, period);
}

/* ---------------------------------------------------------------------------------------------
 * Temperature, power, clocks, fans, modes (device-wide: NOT_SUPPORTED on a MIG handle)
 */

static nvmlReturn_t temperature_of(nvmlDevice_t handle, unsigned sensor, unsigned *value) {
    Target t;
    TRY(physical(handle, &t));
    if (sensor != 0) return E_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU */
    *value = t.g->temperature;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t handle, unsigned sensor, unsigned *out) {
    NEED_INIT();
    unsigned value;
    TRY(temperature_of(handle, sensor, &value));
    OUT(out, value);
    return SUCCESS;
}

typedef struct { unsigned version; unsigned sensorType; int temperature; } Temperature_v1;

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t handle, Temperature_v1 *info) {
    NEED_INIT();
    if (!info) return E_INVALID_ARGUMENT;
    if (info->version != VERSIONED(sizeof(Temperature_v1), 1)) return E_ARGUMENT_VERSION_MISMATCH;
    unsigned value;
    TRY(temperature_of(handle, info->sensorType, &value));
    info->temperature = (int)value;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t handle, unsigned kind, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    /* board thresholds in °C: shutdown, slowdown, memory max, GPU max */
    static const unsigned thresholds[] = {92, 89, 95, 87};
    if (kind >= sizeof thresholds / sizeof *thresholds) return E_NOT_SUPPORTED;
    OUT(out, thresholds[kind]);
    return SUCCESS;
}

#define PHYSICAL_UINT(fn, expr)                               \
    API nvmlReturn_t fn(nvmlDevice_t handle, unsigned *out) { \
        NEED_INIT();                                          \
        Target t;                                             \
        TRY(physical(handle, &t));                            \
        OUT(out, (unsigned)(expr));                           \
        return SUCCESS;                                       \
    }

PHYSICAL_UINT(nvmlDeviceGetPowerUsage, t.g->power_mw)
PHYSICAL_UINT(nvmlDeviceGetEnforcedPowerLimit, t.g->power_limit_mw)
PHYSICAL_UINT(nvmlDeviceGetPowerManagementLimit, t.g->power_limit_mw)
PHYSICAL_UINT(nvmlDeviceGetPowerManagementDefaultLimit,
              t.g->default_power_limit_mw ? t.g->default_power_limit_mw : t.g->power_limit_mw)
PHYSICAL_UINT(nvmlDeviceGetPowerManagementMode, 1u)
PHYSICAL_UINT(nvmlDeviceGetPerformanceState, t.g->pstate)
PHYSICAL_UINT(nvmlDeviceGetPowerState, t.g->pstate)
PHYSICAL_UINT(nvmlDeviceGetPersistenceMode, t.g->persistence)
PHYSICAL_UINT(nvmlDeviceGetDisplayMode, 0u) /* headless datacenter boards */
PHYSICAL_UINT(nvmlDeviceGetDisplayActive, 0u)
PHYSICAL_UINT(nvmlDeviceGetPcieReplayCounter, t.g->pcie_replay)
PHYSICAL_UINT(nvmlDeviceGetCurrPcieLinkGeneration, t.g->pcie_gen)
PHYSICAL_UINT(nvmlDeviceGetCurrPcieLinkWidth, t.g->pcie_width)
PHYSICAL_UINT(nvmlDeviceGetMaxPcieLinkGeneration, t.g->max_pcie_gen)
PHYSICAL_UINT(nvmlDeviceGetGpuMaxPcieLinkGeneration, t.g->max_pcie_gen)
PHYSICAL_UINT(nvmlDeviceGetMaxPcieLinkWidth, t.g->max_pcie_width)

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t handle, unsigned *min, unsigned *max) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    OUT(min, t.g->model_power_limit_mw / 2);
    OUT(max, t.g->model_power_limit_mw);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t handle, unsigned long long *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    OUT(out, t.g->energy_mj);
    return SUCCESS;
}

static nvmlReturn_t current_clock(const Target *t, unsigned type, unsigned *value) {
    switch (type) {
    case 0: *value = t->g->clock_graphics; return SUCCESS;
    case 1: *value = t->g->clock_sm; return SUCCESS;
    case 2: *value = t->g->clock_mem; return SUCCESS;
    case 3: *value = t->g->clock_video; return SUCCESS;
    default: return E_INVALID_ARGUMENT;
    }
}

static nvmlReturn_t max_clock(const Target *t, unsigned type, unsigned *value) {
    switch (type) {
    case 0:
    case 1: *value = t->g->max_sm_clock; return SUCCESS;
    case 2: *value = t->g->max_mem_clock; return SUCCESS;
    case 3: *value = t->g->max_sm_clock * 9 / 10; return SUCCESS;
    default: return E_INVALID_ARGUMENT;
    }
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t handle, unsigned type, unsigned *out) {
    NEED_INIT();
    Target t;
    unsigned value;
    TRY(physical(handle, &t));
    TRY(current_clock(&t, type, &value));
    OUT(out, value);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t handle, unsigned type, unsigned *out) {
    NEED_INIT();
    Target t;
    unsigned value;
    TRY(physical(handle, &t));
    TRY(max_clock(&t, type, &value));
    OUT(out, value);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t handle, unsigned type, unsigned *out) {
    return nvmlDeviceGetMaxClockInfo(handle, type, out);
}

API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t handle, unsigned type, unsigned id, unsigned *out) {
    NEED_INIT();
    Target t;
    unsigned value;
    TRY(physical(handle, &t));
    if (id == 0) { /* current */
        TRY(current_clock(&t, type, &value));
    } else if (id == 1 || id == 2) {
        /* application clocks default to the base clock, about 3/4 of boost on these boards */
        TRY(max_clock(&t, type, &value));
        if (type != 2) value = value * 3 / 4;
    } else if (id == 3) {
        TRY(max_clock(&t, type, &value));
    } else {
        return E_INVALID_ARGUMENT;
    }
    OUT(out, value);
    return SUCCESS;
}

#define PHYSICAL_ULL(fn, expr)                                          \
    API nvmlReturn_t fn(nvmlDevice_t handle, unsigned long long *out) { \
        NEED_INIT();                                                    \
        Target t;                                                       \
        TRY(physical(handle, &t));                                      \
        OUT(out, (unsigned long long)(expr));                           \
        return SUCCESS;                                                 \
    }

PHYSICAL_ULL(nvmlDeviceGetCurrentClocksEventReasons, t.g->clock_event_reasons)
PHYSICAL_ULL(nvmlDeviceGetSupportedClocksEventReasons, t.g->supported_clock_event_reasons)
PHYSICAL_ULL(nvmlDeviceGetCurrentClocksThrottleReasons, t.g->clock_event_reasons)
PHYSICAL_ULL(nvmlDeviceGetSupportedClocksThrottleReasons, t.g->supported_clock_event_reasons)

static nvmlReturn_t fan_of(nvmlDevice_t handle, unsigned *value) {
    Target t;
    TRY(physical(handle, &t));
    if (t.g->fan_percent < 0) return E_NOT_SUPPORTED;
    *value = (unsigned)t.g->fan_percent;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    unsigned value;
    TRY(fan_of(handle, &value));
    OUT(out, value);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t handle, unsigned fan, unsigned *out) {
    NEED_INIT();
    unsigned value;
    TRY(fan_of(handle, &value));
    if (fan != 0) return E_INVALID_ARGUMENT;
    OUT(out, value);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    unsigned value;
    TRY(fan_of(handle, &value));
    OUT(out, 1u);
    return SUCCESS;
}

/* Works on MIG devices too (they inherit the parent's mode). */
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, t.g->compute_mode);
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * PCIe and NVLink
 */

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t handle, unsigned counter, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    if (counter == 0) OUT(out, t.g->pcie_tx_kbps);
    else if (counter == 1) OUT(out, t.g->pcie_rx_kbps);
    else return E_INVALID_ARGUMENT;
    return SUCCESS;
}

/* Per-lane speed in Mbps of the current link generation. */
API nvmlReturn_t nvmlDeviceGetPcieSpeed(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    static const unsigned speeds[] = {16000, 2500, 5000, 8000, 16000, 32000, 64000};
    unsigned gen = t.g->pcie_gen;
    OUT(out, gen >= 1 && gen <= 6 ? speeds[gen] : 16000u);
    return SUCCESS;
}

/* The state of one link: NOT_SUPPORTED on boards (or MIG devices) without NVLink. */
static nvmlReturn_t nvlink_of(nvmlDevice_t handle, unsigned link, Target *t, const NvLinkRec **out) {
    TRY(physical(handle, t));
    if (t->g->nvlink_count == 0 || t->g->model_nvlinks == 0) return E_NOT_SUPPORTED;
    for (unsigned i = 0; i < t->g->nvlink_count && i < MAX_NVLINKS; i++) {
        if (t->g->nvlinks[i].link == link) {
            *out = &t->g->nvlinks[i];
            return SUCCESS;
        }
    }
    return E_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t handle, unsigned link, unsigned *out) {
    NEED_INIT();
    Target t;
    const NvLinkRec *l;
    TRY(nvlink_of(handle, link, &t, &l));
    OUT(out, l->active ? 1u : 0u);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t handle, unsigned link, unsigned *out) {
    NEED_INIT();
    Target t;
    const NvLinkRec *l;
    TRY(nvlink_of(handle, link, &t, &l));
    unsigned arch = t.g->architecture;
    OUT(out, arch == 7 ? 3u : arch == 9 ? 4u : arch == 10 ? 5u : 4u);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t handle, unsigned link, unsigned counter,
                                                 unsigned long long *out) {
    NEED_INIT();
    Target t;
    const NvLinkRec *l;
    TRY(nvlink_of(handle, link, &t, &l));
    if (counter >= N_NVLINK_COUNTERS) return E_INVALID_ARGUMENT;
    OUT(out, l->errors[counter]);
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Field values: each entry carries its own nvmlReturn; the call fails only for the handle
 */

typedef union {
    double dVal;
    unsigned uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} Value;

typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned valueType;
    unsigned nvmlReturn;
    Value value;
} FieldValue;

enum { VT_NONE = 0, VT_UINT = 1, VT_ULL = 3 };

/* NVLink error counter fields: (counter, link or -1 for the total) of a field id, or 0. */
static int nvlink_error_field(unsigned id, unsigned *counter, int *link) {
    /* NVML_NVLINK_ERROR_DL_{REPLAY=0, RECOVERY=1, CRC_FLIT=2, CRC_DATA=3, ECC_DATA=4} */
    static const struct { unsigned first, last, counter; int first_link; int total; } ranges[] = {
        {32, 37, 2, 0, 0}, {38, 38, 2, -1, 1}, {39, 44, 3, 0, 0}, {45, 45, 3, -1, 1},
        {46, 51, 0, 0, 0}, {52, 52, 0, -1, 1}, {53, 58, 1, 0, 0}, {59, 59, 1, -1, 1},
        {96, 101, 2, 6, 0}, {102, 107, 3, 6, 0}, {108, 113, 0, 6, 0}, {114, 119, 1, 6, 0},
        {148, 159, 4, 0, 0}, {160, 160, 4, -1, 1},
    };
    for (unsigned i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        if (id >= ranges[i].first && id <= ranges[i].last) {
            *counter = ranges[i].counter;
            *link = ranges[i].total ? -1 : ranges[i].first_link + (int)(id - ranges[i].first);
            return 1;
        }
    }
    return 0;
}

/* The links a field covers: all (scope ALL_LINKS) or the one numbered `scope`. */
static nvmlReturn_t field_links(const GpuRec *g, unsigned scope, unsigned *first, unsigned *count) {
    if (g->nvlink_count == 0) return E_NOT_SUPPORTED;
    if (scope == ALL_LINKS) {
        *first = 0, *count = g->nvlink_count;
        return SUCCESS;
    }
    for (unsigned i = 0; i < g->nvlink_count && i < MAX_NVLINKS; i++) {
        if (g->nvlinks[i].link == scope) {
            *first = i, *count = 1;
            return SUCCESS;
        }
    }
    return E_INVALID_ARGUMENT;
}

static unsigned bit_index(uint64_t bit) {
    unsigned i = 0;
    while (i < 63 && !(bit & (1ull << i))) i++;
    return i;
}

static nvmlReturn_t read_field(const Target *t, unsigned id, unsigned scope, unsigned *type, uint64_t *value) {
    const GpuRec *g = t->g;
    if (id >= FI_MAX || id == 0) return E_INVALID_ARGUMENT;
    unsigned counter = 0, first, count;
    int link = -1;
    int known = 1;
    switch (id) {
    case 3: case 4: case 5: case 6: /* ECC SBE/DBE, volatile/aggregate totals */
    case 29: case 30: case 31:
    case 74: case 76: case 269: case 270: case 271:
    case 82: case 83: case 191: case 91: case 94: case 197: case 198:
    case 138: case 139: case 140: case 141:
    case 142: case 143: case 144: case 145:
    case 185: case 186: case 187: case 188: case 189: case 190:
    case 230: /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
        break;
    default:
        known = nvlink_error_field(id, &counter, &link);
    }
    if (!known || t->mig) return E_NOT_SUPPORTED; /* device-wide fields only */
    switch (id) {
    case 3: case 4: case 5: case 6: {
        if (g->ecc_enabled != 1) return E_NOT_SUPPORTED;
        unsigned error = (id == 4 || id == 6), counter_type = (id >= 5);
        *type = VT_ULL, *value = g->ecc_totals[error][counter_type];
        return SUCCESS;
    }
    case 29: case 30: case 31:
        if (!g->retired_supported) return E_NOT_SUPPORTED;
        *type = VT_ULL, *value = id == 31 ? (g->retired_pending ? 1 : 0) : g->retired_count[id - 29];
        return SUCCESS;
    case 142: case 143: case 144: case 145:
        if (!g->remap_supported) return E_NOT_SUPPORTED;
        *type = VT_UINT, *value = g->remap[id - 142];
        return SUCCESS;
    case 82:
        if (g->memory_temperature < 0) return E_NOT_SUPPORTED;
        *type = VT_UINT, *value = (uint64_t)g->memory_temperature;
        return SUCCESS;
    case 230: *type = VT_UINT, *value = 0; return SUCCESS; /* NONE: a GPU that answers needs none */
    case 83: case 191: *type = VT_ULL, *value = g->energy_mj; return SUCCESS;
    case 185: case 186: *type = VT_UINT, *value = g->power_mw; return SUCCESS;
    case 190: *type = VT_UINT, *value = g->power_limit_mw; return SUCCESS;
    case 189:
        *type = VT_UINT, *value = g->default_power_limit_mw ? g->default_power_limit_mw : g->power_limit_mw;
        return SUCCESS;
    case 188: *type = VT_UINT, *value = g->model_power_limit_mw; return SUCCESS;
    case 187: *type = VT_UINT, *value = g->model_power_limit_mw / 2; return SUCCESS;
    case 197: *type = VT_ULL, *value = g->pcie_tx_bytes; return SUCCESS;
    case 198: *type = VT_ULL, *value = g->pcie_rx_bytes; return SUCCESS;
    case 94: *type = VT_ULL, *value = g->pcie_replay; return SUCCESS;
    case 91: *type = VT_UINT, *value = g->nvlink_count; return SUCCESS;
    case 138: case 139: case 140: case 141: {
        TRY(field_links(g, scope, &first, &count));
        uint64_t kib = 0;
        for (unsigned i = first; i < first + count; i++)
            kib += (id == 138 || id == 140) ? g->nvlinks[i].tx_kib : g->nvlinks[i].rx_kib;
        *type = VT_ULL, *value = id >= 140 ? kib + kib / 16 : kib; /* raw adds the protocol overhead */
        return SUCCESS;
    }
    case 74: case 76: case 269: case 270: case 271: {
        uint64_t bit = id == 74 ? 0x4 : id == 76 ? 0x10 : id == 269 ? 0x20 : id == 270 ? 0x40 : 0x80;
        if (!(g->supported_clock_event_reasons & bit)) return E_NOT_SUPPORTED;
        *type = VT_ULL, *value = g->clock_reason_ns[bit_index(bit)];
        return SUCCESS;
    }
    default: { /* NVLink error counters, per link or summed */
        TRY(field_links(g, link < 0 ? ALL_LINKS : (unsigned)link, &first, &count));
        uint64_t sum = 0;
        for (unsigned i = first; i < first + count; i++) sum += g->nvlinks[i].errors[counter];
        *type = VT_ULL, *value = sum;
        return SUCCESS;
    }
    }
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t handle, int count, FieldValue *values) {
    NEED_INIT();
    if (count <= 0) return E_INVALID_ARGUMENT;
    Target t;
    TRY(device(handle, &t));
    if (!values) return E_INVALID_ARGUMENT;
    long long stamp = (long long)(sim_now(t.h) * 1e6);
    for (int i = 0; i < count; i++) {
        FieldValue *entry = &values[i];
        unsigned type = VT_NONE;
        uint64_t value = 0;
        nvmlReturn_t rc = read_field(&t, entry->fieldId, entry->scopeId, &type, &value);
        if (rc != SUCCESS) type = VT_NONE, value = 0;
        entry->timestamp = stamp, entry->latencyUsec = 0;
        entry->nvmlReturn = (unsigned)rc, entry->valueType = type;
        entry->value.ullVal = type == VT_UINT ? 0 : value;
        if (type == VT_UINT) entry->value.uiVal = (unsigned)value;
    }
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Memory health: ECC, retired pages (pre-Ampere), remapped rows (Ampere+)
 */

static nvmlReturn_t ecc_target(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    return t->g->ecc_enabled < 0 ? E_NOT_SUPPORTED : SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t handle, unsigned *current, unsigned *pending) {
    NEED_INIT();
    Target t;
    TRY(ecc_target(handle, &t));
    OUT(current, t.g->ecc_enabled == 1 ? 1u : 0u);
    OUT(pending, t.g->ecc_enabled == 1 ? 1u : 0u);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(ecc_target(handle, &t));
    OUT(out, t.g->ecc_default ? 1u : 0u);
    return SUCCESS;
}

/* Device-wide; NOT_SUPPORTED while ECC is off (no counters are kept then). */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t handle, unsigned error, unsigned counter,
                                             unsigned long long *out) {
    NEED_INIT();
    Target t;
    TRY(ecc_target(handle, &t));
    if (t.mig) return E_NOT_SUPPORTED;
    if (error > 1 || counter > 1) return E_INVALID_ARGUMENT;
    if (t.g->ecc_enabled != 1) return E_NOT_SUPPORTED;
    OUT(out, t.g->ecc_totals[error][counter]);
    return SUCCESS;
}

/* On a MIG device only the instance-local kind (uncorrected, volatile, not DRAM) is served. */
API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t handle, unsigned error, unsigned counter,
                                                 unsigned location, unsigned long long *out) {
    NEED_INIT();
    Target t;
    TRY(ecc_target(handle, &t));
    if (error > 1 || counter > 1) return E_INVALID_ARGUMENT;
    if (location >= N_LOCATIONS) return E_INVALID_ARGUMENT;
    if (t.g->ecc_enabled != 1) return E_NOT_SUPPORTED;
    if (t.mig && (error != 1 || counter != 0 || location == 2)) return E_NOT_SUPPORTED;
    OUT(out, t.g->memory_errors[error][counter][location]);
    return SUCCESS;
}

static nvmlReturn_t retired_of(nvmlDevice_t handle, unsigned cause, Target *t) {
    TRY(physical(handle, t));
    if (!t->g->retired_supported) return E_NOT_SUPPORTED;
    if (cause > 1) return E_INVALID_ARGUMENT;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t handle, unsigned cause, unsigned *count,
                                           unsigned long long *addresses) {
    NEED_INIT();
    Target t;
    TRY(retired_of(handle, cause, &t));
    unsigned n = t.g->retired_count[cause];
    if (n > MAX_RETIRED) n = MAX_RETIRED;
    TRY(handshake(count, addresses, n));
    for (unsigned i = 0; i < n; i++) addresses[i] = t.g->retired_address[cause][i];
    return SUCCESS;
}

/* pynvml's size probe passes only four arguments: `times` is then garbage, but it is only
 * read when a buffer large enough was passed, which that probe never does. */
API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t handle, unsigned cause, unsigned *count,
                                              unsigned long long *addresses, unsigned long long *times) {
    NEED_INIT();
    Target t;
    TRY(retired_of(handle, cause, &t));
    unsigned n = t.g->retired_count[cause];
    if (n > MAX_RETIRED) n = MAX_RETIRED;
    TRY(handshake(count, addresses, n));
    for (unsigned i = 0; i < n; i++) {
        addresses[i] = t.g->retired_address[cause][i];
        if (times) times[i] = t.g->retired_time_us[cause][i];
    }
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(physical(handle, &t));
    if (!t.g->retired_supported) return E_NOT_SUPPORTED;
    OUT(out, t.g->retired_pending ? 1u : 0u);
    return SUCCESS;
}

/* NOT_SUPPORTED on boards without row remapping and, as on the real driver, once MIG
 * instances exist on the GPU (even when asked through the parent). */
static nvmlReturn_t remapped_of(nvmlDevice_t handle, Target *t) {
    TRY(physical(handle, t));
    if (!t->g->remap_supported || (mig_enabled(t) && t->g->mig_count)) return E_NOT_SUPPORTED;
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t handle, unsigned *corr, unsigned *unc,
                                           unsigned *pending, unsigned *failure) {
    NEED_INIT();
    Target t;
    TRY(remapped_of(handle, &t));
    OUT(corr, t.g->remap[0]);
    OUT(unc, t.g->remap[1]);
    OUT(pending, t.g->remap[2]);
    OUT(failure, t.g->remap[3]);
    return SUCCESS;
}

typedef struct {
    unsigned corrActiveRemaps, corrInactiveRemaps, uncActiveRemaps, uncInactiveRemaps, bPending,
        bfailureOccurred;
} RemappedRows_v2;

API nvmlReturn_t nvmlDeviceGetRemappedRows_v2(nvmlDevice_t handle, RemappedRows_v2 *out) {
    NEED_INIT();
    Target t;
    TRY(remapped_of(handle, &t));
    if (!out) return E_INVALID_ARGUMENT;
    out->corrActiveRemaps = t.g->remap[0], out->corrInactiveRemaps = 0;
    out->uncActiveRemaps = t.g->remap[1], out->uncInactiveRemaps = 0;
    out->bPending = t.g->remap[2], out->bfailureOccurred = t.g->remap[3];
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Opaque objects (event sets, GPM samples): malloc'd, and known to the library so that a freed
 * or foreign pointer is INVALID_ARGUMENT rather than a crash
 */

enum { KIND_EVENT_SET = 0x45565354, KIND_GPM_SAMPLE = 0x47504d53 };

typedef struct Object {
    unsigned kind;
    struct Object *next;
} Object;

static Object *g_objects;

static void *object_new(unsigned kind, size_t size) {
    Object *o = calloc(1, size);
    if (!o) return NULL;
    o->kind = kind;
    pthread_mutex_lock(&g_lock);
    o->next = g_objects;
    g_objects = o;
    pthread_mutex_unlock(&g_lock);
    return o;
}

/* Called with g_lock held. */
static Object *object_find(const void *p, unsigned kind) {
    for (Object *o = g_objects; o; o = o->next)
        if (o == p) return o->kind == kind ? o : NULL;
    return NULL;
}

static nvmlReturn_t object_free(void *p, unsigned kind) {
    pthread_mutex_lock(&g_lock);
    Object **link = &g_objects;
    while (*link && (void *)*link != p) link = &(*link)->next;
    if (!*link || (*link)->kind != kind) {
        pthread_mutex_unlock(&g_lock);
        return E_INVALID_ARGUMENT;
    }
    Object *o = *link;
    *link = o->next;
    pthread_mutex_unlock(&g_lock);
    free(o);
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Event sets: events after registration, delivered once; nvmlEventSetWait blocks for real
 */

typedef struct {
    Object object;
    uint64_t mask[MAX_GPUS];
    double since[MAX_GPUS];
    uint64_t cursor;  /* next event (by publish count) to look at */
    int started;
} EventSet;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} EventData;

#define BASE_EVENTS (0x1ull | 0x2ull | 0x4ull | 0x8ull | 0x10ull | 0x80ull)

static uint64_t supported_events(const GpuRec *g) { return BASE_EVENTS | (g->mig_capable ? 0x100ull : 0); }

API nvmlReturn_t nvmlEventSetCreate(void **out) {
    NEED_INIT();
    if (!out) return E_INVALID_ARGUMENT;
    EventSet *set = object_new(KIND_EVENT_SET, sizeof(EventSet));
    if (!set) return E_UNKNOWN;
    *out = set;
    return SUCCESS;
}

API nvmlReturn_t nvmlEventSetFree(void *set) {
    NEED_INIT();
    return object_free(set, KIND_EVENT_SET);
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t handle, unsigned long long *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, t.mig ? 0ull : supported_events(t.g));
    return SUCCESS;
}

/* Unsupported bits register nothing (NS). MIG devices take no registrations: register on the
 * parent, whose events carry the GPU/compute instance ids. */
API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t handle, unsigned long long mask, void *set_ptr) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    pthread_mutex_lock(&g_lock);
    EventSet *set = (EventSet *)object_find(set_ptr, KIND_EVENT_SET);
    nvmlReturn_t rc = SUCCESS;
    if (!set) rc = E_INVALID_ARGUMENT;
    else if (t.mig || (mask & ~supported_events(t.g))) rc = E_NOT_SUPPORTED;
    else {
        double now = sim_now(t.h);
        if (!set->mask[t.index]) set->since[t.index] = now;
        set->mask[t.index] |= mask;
        if (!set->started) {
            set->started = 1;
            set->cursor = t.h->events_total;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The next registered event at or after the set's cursor, advancing it; 0 when none. */
static int next_event(const ShmHeader *h, EventSet *set, EventRec *found) {
    uint64_t oldest = h->events_total > h->event_ring ? h->events_total - h->event_ring : 0;
    if (set->cursor < oldest) set->cursor = oldest; /* fell behind the ring: those are gone */
    const EventRec *ring = events(h);
    while (set->cursor < h->events_total) {
        const EventRec *e = &ring[set->cursor % h->event_ring];
        set->cursor++;
        if (e->gpu < MAX_GPUS && (set->mask[e->gpu] & e->event_type) && e->time > set->since[e->gpu]) {
            *found = *e;
            return 1;
        }
    }
    return 0;
}

/* The low 32 bits of the header's events_total, in the mapping: the futex word that waiting calls
 * sleep on and the publisher wakes (a shared, not private, futex: the two sides are processes). */
static uint32_t *events_word(const ShmHeader *h) {
    const uint32_t *word = (const uint32_t *)&h->events_total;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    word += 1;
#endif
    return (uint32_t *)word;
}

/* Whether the ring may hold events the set has not looked at: the published count, read under the
 * seqlock straight from the mapping, against the set's cursor. Saves a waiting call the copy of the
 * whole node that view() makes after every publish; 1 (look) whenever it cannot tell. `word` gets
 * the futex word's value the answer was based on. */
static int events_pending(void *set_ptr, uint32_t *word) {
    const unsigned char *map = __atomic_load_n(&g_map, __ATOMIC_ACQUIRE);
    if (!map) return 1;
    const ShmHeader *shared = (const ShmHeader *)map;
    uint64_t seq = __atomic_load_n(&shared->seq, __ATOMIC_ACQUIRE);
    if (seq & 1) return 1;
    uint64_t total = __atomic_load_n(&shared->events_total, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&shared->seq, __ATOMIC_RELAXED) != seq) return 1;
    *word = (uint32_t)total;
    pthread_mutex_lock(&g_lock);
    EventSet *set = (EventSet *)object_find(set_ptr, KIND_EVENT_SET);
    int pending = !set || !set->started || set->cursor < total;
    pthread_mutex_unlock(&g_lock);
    return pending;
}

/* Sleep until the publisher publishes events (the futex word moves from `seen`) or `seconds` pass. */
static void wait_for_events(uint32_t seen, double seconds) {
    const unsigned char *map = __atomic_load_n(&g_map, __ATOMIC_ACQUIRE);
    if (map) {
        struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
        long rc = syscall(SYS_futex, events_word((const ShmHeader *)map), FUTEX_WAIT, seen, &ts, NULL, 0);
        if (rc == 0 || errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR) return;
    }
    sleep_seconds(seconds < 0.1 ? seconds : 0.1); /* no futex here: poll at the state quantum */
}

API nvmlReturn_t nvmlEventSetWait_v2(void *set_ptr, EventData *data, unsigned timeout_ms) {
    NEED_INIT();
    double deadline = monotonic_seconds() + timeout_ms / 1000.0;
    EventRec event;
    for (int first = 1;; first = 0) {
        uint32_t seen = 0;
        if (!first && !events_pending(set_ptr, &seen)) {
            double left = deadline - monotonic_seconds();
            if (left <= 0) return E_TIMEOUT;
            wait_for_events(seen, left < EVENT_POLL_NS / 1e9 ? left : EVENT_POLL_NS / 1e9);
            continue;
        }
        const ShmHeader *h = view();
        if (!h) return E_UNINITIALIZED;
        pthread_mutex_lock(&g_lock);
        EventSet *set = (EventSet *)object_find(set_ptr, KIND_EVENT_SET);
        int got = set && set->started && next_event(h, set, &event);
        pthread_mutex_unlock(&g_lock);
        if (!set) return E_INVALID_ARGUMENT;
        if (got) break;
        double left = deadline - monotonic_seconds();
        if (left <= 0) return E_TIMEOUT;
        sleep_seconds(left < EVENT_POLL_NS / 1e9 ? left : EVENT_POLL_NS / 1e9);
    }
    if (!data) return E_INVALID_ARGUMENT;
    data->device = gpu_handle(event.gpu);
    data->eventType = event.event_type;
    data->eventData = event.data;
    data->gpuInstanceId = event.gpu_instance_id;
    data->computeInstanceId = event.compute_instance_id;
    return SUCCESS;
}

API nvmlReturn_t nvmlEventSetWait(void *set, EventData *data, unsigned timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* ---------------------------------------------------------------------------------------------
 * Processes, per-process utilization, accounting
 */

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} ProcessInfo; /* v2 and v3 share this four-field layout */

enum { LIST_COMPUTE, LIST_GRAPHICS, LIST_MPS };

typedef struct {
    const ProcRec *proc;
    int memory_known;
} Listed;

#define MAX_LISTED 1024 /* entries one list call returns at most (on the stack) */

static int in_list(const ProcRec *p, int list, int from_clients) {
    if (from_clients) return list == LIST_MPS;
    switch (list) {
    case LIST_COMPUTE: return p->kind == PROC_COMPUTE || p->kind == PROC_MPS_SERVER;
    case LIST_GRAPHICS: return p->kind == PROC_GRAPHICS;
    default: return p->kind == PROC_MPS_CLIENT;
    }
}

static unsigned list_group(const ShmHeader *h, unsigned pfirst, unsigned pcount, unsigned cfirst,
                           unsigned ccount, int list, int memory_known, Listed *out, unsigned n) {
    const ProcRec *table = procs(h);
    if (list == LIST_MPS) /* the MPS list: clients first, then processes of kind mps_client */
        for (unsigned i = 0; i < ccount && n < MAX_LISTED; i++) out[n].proc = &table[cfirst + i], out[n++].memory_known = memory_known;
    for (unsigned i = 0; i < pcount && n < MAX_LISTED; i++)
        if (in_list(&table[pfirst + i], list, 0)) out[n].proc = &table[pfirst + i], out[n++].memory_known = memory_known;
    return n;
}

/* What a list call returns for this handle. A MIG device lists its own instance's processes;
 * the parent of a MIG GPU lists every instance's, with usedGpuMemory not available (as the
 * real driver does for a privileged caller). */
static unsigned listed(const Target *t, int list, Listed *out) {
    unsigned n = 0;
    if (t->mig) {
        const MigRec *m = t->mig;
        n = list_group(t->h, m->proc_first, m->proc_count, m->client_first, m->client_count, list, 1, out, n);
    } else if (mig_enabled(t)) {
        for (unsigned i = 0; i < t->g->mig_count && i < MAX_MIG; i++) {
            const MigRec *m = &t->g->mig[i];
            n = list_group(t->h, m->proc_first, m->proc_count, m->client_first, m->client_count, list, 0, out, n);
        }
    } else {
        const GpuRec *g = t->g;
        n = list_group(t->h, g->proc_first, g->proc_count, g->client_first, g->client_count, list, 1, out, n);
    }
    return n;
}

static nvmlReturn_t running_processes(nvmlDevice_t handle, unsigned *count, ProcessInfo *infos, int list) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    Listed items[MAX_LISTED];
    unsigned n = listed(&t, list, items);
    TRY(handshake(count, infos, n));
    for (unsigned i = 0; i < n; i++) {
        const ProcRec *p = items[i].proc;
        infos[i].pid = p->pid;
        infos[i].usedGpuMemory = (p->memory_known && items[i].memory_known) ? p->used_memory : NOT_AVAILABLE_ULL;
        infos[i].gpuInstanceId = p->gpu_instance_id;
        infos[i].computeInstanceId = p->compute_instance_id;
    }
    return SUCCESS;
}

#define PROCESS_LIST(name, list)                                                       \
    API nvmlReturn_t name##_v3(nvmlDevice_t handle, unsigned *count, ProcessInfo *infos) { \
        return running_processes(handle, count, infos, list);                         \
    }                                                                                  \
    API nvmlReturn_t name##_v2(nvmlDevice_t handle, unsigned *count, ProcessInfo *infos) { \
        return running_processes(handle, count, infos, list);                         \
    }

PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, LIST_COMPUTE)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, LIST_GRAPHICS)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, LIST_MPS)

/* Every process of the handle's lists, each pid once (compute, graphics, then MPS order). */
static unsigned all_processes(const Target *t, const ProcRec **out) {
    Listed items[MAX_LISTED];
    unsigned n = 0;
    for (int list = LIST_COMPUTE; list <= LIST_MPS; list++) {
        unsigned got = listed(t, list, items);
        for (unsigned i = 0; i < got; i++) {
            unsigned k = 0;
            while (k < n && out[k]->pid != items[i].proc->pid) k++;
            if (k == n && n < MAX_LISTED) out[n++] = items[i].proc;
        }
    }
    return n;
}

/* Processes busy since `last_seen_us`: NOT_SUPPORTED with MIG, NOT_FOUND when none (idle GPU). */
static nvmlReturn_t utilization_samples(const Target *t, unsigned long long last_seen_us, const ProcRec **out,
                                        unsigned *n, unsigned long long *stamp) {
    if (t->mig || mig_enabled(t)) return E_NOT_SUPPORTED;
    *stamp = (unsigned long long)(sim_now(t->h) * 1e6);
    const ProcRec *all[MAX_LISTED];
    unsigned total = all_processes(t, all), k = 0;
    for (unsigned i = 0; i < total; i++)
        if ((all[i]->sm_util || all[i]->mem_util) && *stamp > last_seen_us) out[k++] = all[i];
    *n = k;
    return k ? SUCCESS : E_NOT_FOUND;
}

typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} ProcessUtilizationSample;

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t handle, ProcessUtilizationSample *samples,
                                                 unsigned *count, unsigned long long last_seen) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    const ProcRec *busy[MAX_LISTED];
    unsigned n;
    unsigned long long stamp;
    TRY(utilization_samples(&t, last_seen, busy, &n, &stamp));
    TRY(handshake(count, samples, n));
    for (unsigned i = 0; i < n; i++) {
        samples[i].pid = busy[i]->pid, samples[i].timeStamp = stamp;
        samples[i].smUtil = busy[i]->sm_util, samples[i].memUtil = busy[i]->mem_util;
        samples[i].encUtil = samples[i].decUtil = 0;
    }
    return SUCCESS;
}

typedef struct {
    unsigned long long timeStamp;
    unsigned pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} ProcessUtilizationInfo_v1;

typedef struct {
    unsigned version;
    unsigned processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    ProcessUtilizationInfo_v1 *procUtilArray;
} ProcessesUtilizationInfo_v1;

API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t handle, ProcessesUtilizationInfo_v1 *info) {
    NEED_INIT();
    if (!info) return E_INVALID_ARGUMENT;
    if (info->version != VERSIONED(sizeof(ProcessesUtilizationInfo_v1), 1)) return E_ARGUMENT_VERSION_MISMATCH;
    Target t;
    TRY(device(handle, &t));
    const ProcRec *busy[MAX_LISTED];
    unsigned n;
    unsigned long long stamp;
    TRY(utilization_samples(&t, info->lastSeenTimeStamp, busy, &n, &stamp));
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return E_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        ProcessUtilizationInfo_v1 *e = &info->procUtilArray[i];
        e->timeStamp = stamp, e->pid = busy[i]->pid;
        e->smUtil = busy[i]->sm_util, e->memUtil = busy[i]->mem_util;
        e->encUtil = e->decUtil = e->jpgUtil = e->ofaUtil = 0;
    }
    info->processSamplesCount = n;
    return SUCCESS;
}

static nvmlReturn_t accounting_target(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    return t->mig ? E_NOT_SUPPORTED : SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(accounting_target(handle, &t));
    OUT(out, t.g->accounting ? 1u : 0u);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(accounting_target(handle, &t));
    OUT(out, 4000u); /* pids the driver keeps accounting records for */
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t handle, unsigned *count, unsigned *pids) {
    NEED_INIT();
    Target t;
    TRY(accounting_target(handle, &t));
    if (!t.g->accounting) return E_NOT_SUPPORTED;
    const ProcRec *all[MAX_LISTED];
    unsigned n = all_processes(&t, all);
    TRY(handshake(count, pids, n));
    for (unsigned i = 0; i < n; i++) pids[i] = all[i]->pid;
    return SUCCESS;
}

typedef struct {
    unsigned gpuUtilization, memoryUtilization;
    unsigned long long maxMemoryUsage, time, startTime;
    unsigned isRunning;
    unsigned reserved[5];
} AccountingStats;

API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t handle, unsigned pid, AccountingStats *out) {
    NEED_INIT();
    Target t;
    TRY(accounting_target(handle, &t));
    if (!t.g->accounting) return E_NOT_SUPPORTED;
    const ProcRec *all[MAX_LISTED];
    unsigned n = all_processes(&t, all);
    const ProcRec *p = NULL;
    for (unsigned i = 0; i < n && !p; i++)
        if (all[i]->pid == pid) p = all[i];
    if (!p) return E_NOT_FOUND;
    if (!out) return E_INVALID_ARGUMENT;
    out->gpuUtilization = p->sm_util, out->memoryUtilization = p->mem_util;
    out->maxMemoryUsage = p->memory_known ? p->used_memory : NOT_AVAILABLE_ULL;
    out->time = 0; /* still running */
    out->startTime = (unsigned long long)(p->start_time * 1e6);
    out->isRunning = 1;
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * MIG
 */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t handle, unsigned *current, unsigned *pending) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (t.mig || t.g->mig_current < 0) return E_NOT_SUPPORTED;
    OUT(current, (unsigned)t.g->mig_current);
    OUT(pending, (unsigned)(t.g->mig_pending < 0 ? t.g->mig_current : t.g->mig_pending));
    return SUCCESS;
}

/* 0 when MIG is unsupported or off (the real call does not fail then). */
static unsigned max_mig_devices(const Target *t) {
    return (t->mig || !mig_enabled(t)) ? 0 : t->g->compute_slices;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, max_mig_devices(&t));
    return SUCCESS;
}

/* NOT_FOUND for an empty slot: callers iterate 0..max-1 and skip the holes. With MIG off on a
 * MIG-capable GPU every slot is empty: NOT_FOUND too (a real H200, driver 580), not NOT_SUPPORTED. */
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t handle, unsigned slot, nvmlDevice_t *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (t.mig) return E_INVALID_ARGUMENT;
    if (!mig_capable(&t)) return E_NOT_SUPPORTED;
    if (!mig_enabled(&t)) return E_NOT_FOUND;
    if (slot >= max_mig_devices(&t)) return E_INVALID_ARGUMENT;
    if (!mig_by_slot(t.g, slot)) return E_NOT_FOUND;
    OUT(out, mig_handle(t.index, slot));
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    OUT(out, t.mig ? 1u : 0u);
    return SUCCESS;
}

static nvmlReturn_t mig_only(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    return t->mig ? SUCCESS : E_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t handle, nvmlDevice_t *out) {
    NEED_INIT();
    Target t;
    TRY(mig_only(handle, &t));
    OUT(out, gpu_handle(t.index));
    return SUCCESS;
}

/* The GPU/compute-instance id calls: a full-GPU handle of a MIG-capable GPU is an invalid argument
 * (a real H200, MIG off, driver 580); a GPU without MIG stays NOT_SUPPORTED. */
static nvmlReturn_t instance_of(nvmlDevice_t handle, Target *t) {
    TRY(device(handle, t));
    if (t->mig) return SUCCESS;
    return mig_capable(t) ? E_INVALID_ARGUMENT : E_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(instance_of(handle, &t));
    OUT(out, t.mig->gpu_instance_id);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(instance_of(handle, &t));
    OUT(out, t.mig->compute_instance_id);
    return SUCCESS;
}

typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} DeviceAttributes;

API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t handle, DeviceAttributes *out) {
    NEED_INIT();
    Target t;
    TRY(mig_only(handle, &t));
    if (!out) return E_INVALID_ARGUMENT;
    const MigRec *m = t.mig;
    out->multiprocessorCount = m->sm_count;
    out->sharedCopyEngineCount = m->copy, out->sharedDecoderCount = m->decoder;
    out->sharedEncoderCount = m->encoder, out->sharedJpegCount = m->jpeg, out->sharedOfaCount = m->ofa;
    out->gpuInstanceSliceCount = out->computeInstanceSliceCount = m->slices;
    out->memorySizeMB = m->memory_total / (1024 * 1024);
    return SUCCESS;
}

typedef struct {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} GpuInstanceProfileInfo;

typedef struct {
    unsigned version;
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} GpuInstanceProfileInfo_v2;

static nvmlReturn_t profile_of(nvmlDevice_t handle, unsigned id, const ProfileRec **out) {
    Target t;
    TRY(device(handle, &t));
    /* MIG need not be on: a MIG-capable GPU describes its profiles with MIG off (a real H200) */
    if (!mig_capable(&t)) return E_NOT_SUPPORTED;
    if (id >= MAX_PROFILES) return E_INVALID_ARGUMENT;
    if (!t.g->profiles[id].valid) return E_NOT_SUPPORTED;
    *out = &t.g->profiles[id];
    return SUCCESS;
}

#define FILL_PROFILE(info, p)                                                              \
    do {                                                                                   \
        (info)->id = (p)->id, (info)->isP2pSupported = 0, (info)->sliceCount = (p)->slices; \
        (info)->instanceCount = (p)->instances, (info)->multiprocessorCount = (p)->sm_count; \
        (info)->copyEngineCount = (p)->copy, (info)->decoderCount = (p)->decoder;           \
        (info)->encoderCount = (p)->encoder, (info)->jpegCount = (p)->jpeg;                 \
        (info)->ofaCount = (p)->ofa, (info)->memorySizeMB = (p)->memory_mb;                 \
    } while (0)

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t handle, unsigned id, GpuInstanceProfileInfo *out) {
    NEED_INIT();
    const ProfileRec *p;
    TRY(profile_of(handle, id, &p));
    if (!out) return E_INVALID_ARGUMENT;
    FILL_PROFILE(out, p);
    return SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t handle, unsigned id, GpuInstanceProfileInfo_v2 *out) {
    NEED_INIT();
    if (!out) return E_INVALID_ARGUMENT;
    if (out->version != VERSIONED(sizeof(GpuInstanceProfileInfo_v2), 2)) return E_ARGUMENT_VERSION_MISMATCH;
    const ProfileRec *p;
    TRY(profile_of(handle, id, &p));
    FILL_PROFILE(out, p);
    out->version = 0; /* a real H200 (driver 580) hands the struct back with its version cleared */
    snprintf(out->name, sizeof out->name, "%s", p->name);
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * GPM (Hopper and newer): two samples give the average activity between them
 */

typedef struct {
    Object object;
    int taken;
    unsigned gpu;
    int gpu_instance_id; /* -1: the whole GPU */
    double time;
    double activity[N_ACTIVITY];
} GpmSample;

typedef struct {
    const char *shortName, *longName, *unit;
} MetricInfo;

typedef struct {
    unsigned metricId;
    unsigned nvmlReturn;
    double value;
    MetricInfo metricInfo;
} GpmMetric;

typedef struct {
    unsigned version;
    unsigned numMetrics;
    void *sample1, *sample2;
    GpmMetric metrics[GPM_METRIC_MAX];
} GpmMetricsGet;

typedef struct {
    unsigned version;
    unsigned isSupportedDevice;
} GpmSupport;

enum { M_NONE, M_PERCENT, M_MIB, M_LINK, M_ZERO };

typedef struct {
    int kind, attr, link;
    char short_name[32], long_name[32];
    const char *unit;
} Metric;

static Metric g_metrics[GPM_METRIC_MAX];
static pthread_once_t g_metrics_once = PTHREAD_ONCE_INIT;

static void metric(unsigned id, int kind, int attr, int link, const char *name) {
    Metric *m = &g_metrics[id];
    m->kind = kind, m->attr = attr, m->link = link;
    snprintf(m->short_name, sizeof m->short_name, "%s", name);
    snprintf(m->long_name, sizeof m->long_name, "%s", name);
    for (char *c = m->long_name; *c; c++)
        if (*c == '_') *c = ' ';
    m->unit = (kind == M_MIB || kind == M_LINK) ? "MiB/sec" : "%";
}

static void metrics_init(void) {
    metric(1, M_PERCENT, ACT_GRAPHICS, 0, "gr_util");
    metric(2, M_PERCENT, ACT_SM, 0, "sm_util");
    metric(3, M_PERCENT, ACT_SM_OCCUPANCY, 0, "sm_occupancy");
    metric(4, M_PERCENT, ACT_INTEGER, 0, "integer_util");
    metric(5, M_PERCENT, ACT_TENSOR, 0, "any_tensor_util");
    metric(6, M_ZERO, 0, 0, "dfma_tensor_util");
    metric(7, M_PERCENT, ACT_TENSOR, 0, "hmma_tensor_util");
    metric(9, M_ZERO, 0, 0, "imma_tensor_util");
    metric(10, M_PERCENT, ACT_DRAM, 0, "dram_bw_util");
    metric(11, M_PERCENT, ACT_FP64, 0, "fp64_util");
    metric(12, M_PERCENT, ACT_FP32, 0, "fp32_util");
    metric(13, M_PERCENT, ACT_FP16, 0, "fp16_util");
    metric(20, M_MIB, ACT_PCIE_TX, 0, "pcie_tx");
    metric(21, M_MIB, ACT_PCIE_RX, 0, "pcie_rx");
    metric(60, M_MIB, ACT_NVLINK_RX, 0, "nvlink_total_rx");
    metric(61, M_MIB, ACT_NVLINK_TX, 0, "nvlink_total_tx");
    char name[32];
    for (int link = 0; link < 18; link++) {
        snprintf(name, sizeof name, "nvlink_l%d_rx", link);
        metric(62 + 2 * link, M_LINK, ACT_NVLINK_RX, link, name);
        snprintf(name, sizeof name, "nvlink_l%d_tx", link);
        metric(63 + 2 * link, M_LINK, ACT_NVLINK_TX, link, name);
    }
    /* the media engines (NVDEC, NVJPG, NVOFA): idle */
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "nvdec_%d_util", i);
        metric(30 + i, M_ZERO, 0, 0, name);
        snprintf(name, sizeof name, "nvjpg_%d_util", i);
        metric(40 + i, M_ZERO, 0, 0, name);
    }
    metric(50, M_ZERO, 0, 0, "nvofa_0_util");
    metric(51, M_ZERO, 0, 0, "nvofa_1_util");
}

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t handle, GpmSupport *out) {
    NEED_INIT();
    if (!out) return E_INVALID_ARGUMENT;
    if (out->version != 1) return E_ARGUMENT_VERSION_MISMATCH;
    Target t;
    TRY(device(handle, &t));
    out->isSupportedDevice = t.g->gpm_supported ? 1 : 0;
    return SUCCESS;
}


API nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t handle, unsigned *out) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!t.g->gpm_supported) return E_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    unsigned on = (g_gpm_streaming >> t.index) & 1;
    pthread_mutex_unlock(&g_lock);
    OUT(out, on);
    return SUCCESS;
}

/* Streaming only changes how the driver buffers samples; the values served are the same. */
API nvmlReturn_t nvmlGpmSetStreamingEnabled(nvmlDevice_t handle, unsigned state) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (!t.g->gpm_supported || t.mig) return E_NOT_SUPPORTED;
    if (state > 1) return E_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    if (state) g_gpm_streaming |= 1ull << t.index;
    else g_gpm_streaming &= ~(1ull << t.index);
    pthread_mutex_unlock(&g_lock);
    return SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleAlloc(void **out) {
    NEED_INIT();
    if (!out) return E_INVALID_ARGUMENT;
    GpmSample *sample = object_new(KIND_GPM_SAMPLE, sizeof(GpmSample));
    if (!sample) return E_UNKNOWN;
    *out = sample;
    return SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleFree(void *sample) {
    NEED_INIT();
    return object_free(sample, KIND_GPM_SAMPLE);
}

/* A sample holds the activity integrals as last published, and the time they are for. */
static nvmlReturn_t take(const Target *t, const MigRec *mig, void *sample_ptr) {
    if (!t->g->gpm_supported) return E_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    GpmSample *sample = (GpmSample *)object_find(sample_ptr, KIND_GPM_SAMPLE);
    if (sample) {
        sample->taken = 1;
        sample->gpu = t->index;
        sample->gpu_instance_id = mig ? (int)mig->gpu_instance_id : -1;
        sample->time = t->g->activity_time;
        memcpy(sample->activity, mig ? mig->activity : t->g->activity, sizeof sample->activity);
    }
    pthread_mutex_unlock(&g_lock);
    return sample ? SUCCESS : E_INVALID_ARGUMENT;
}

/* On a MIG handle the sample covers that GPU instance. */
API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t handle, void *sample) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    return take(&t, t.mig, sample);
}

API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t handle, unsigned gpu_instance_id, void *sample) {
    NEED_INIT();
    Target t;
    TRY(device(handle, &t));
    if (t.mig || !mig_enabled(&t)) return E_INVALID_ARGUMENT;
    const MigRec *mig = mig_by_gi(t.g, gpu_instance_id);
    if (!mig) return E_NOT_FOUND;
    return take(&t, mig, sample);
}

API nvmlReturn_t nvmlGpmMetricsGet(GpmMetricsGet *request) {
    NEED_INIT();
    pthread_once(&g_metrics_once, metrics_init);
    if (!request) return E_INVALID_ARGUMENT;
    if (request->version != 1) return E_ARGUMENT_VERSION_MISMATCH;
    if (request->numMetrics > GPM_METRIC_MAX) return E_INVALID_ARGUMENT;
    GpmSample first, second;
    pthread_mutex_lock(&g_lock);
    GpmSample *a = (GpmSample *)object_find(request->sample1, KIND_GPM_SAMPLE);
    GpmSample *b = (GpmSample *)object_find(request->sample2, KIND_GPM_SAMPLE);
    if (a) first = *a;
    if (b) second = *b;
    pthread_mutex_unlock(&g_lock);
    if (!a || !b || !first.taken || !second.taken) return E_INVALID_ARGUMENT;
    if (first.gpu != second.gpu || first.gpu_instance_id != second.gpu_instance_id) return E_INVALID_ARGUMENT;
    Target t;
    TRY(device(gpu_handle(first.gpu), &t));
    double span = second.time - first.time;
    unsigned active = 0;
    for (unsigned i = 0; i < t.g->nvlink_count && i < MAX_NVLINKS; i++) active += t.g->nvlinks[i].active ? 1 : 0;
    for (unsigned i = 0; i < request->numMetrics; i++) {
        GpmMetric *m = &request->metrics[i];
        const Metric *known = m->metricId < GPM_METRIC_MAX ? &g_metrics[m->metricId] : NULL;
        if (!known || known->kind == M_NONE) {
            m->nvmlReturn = E_NOT_SUPPORTED, m->value = NAN;
            continue;
        }
        double mean = span != 0 ? (second.activity[known->attr] - first.activity[known->attr]) / span : 0;
        m->nvmlReturn = SUCCESS;
        if (span == 0) {
            m->value = NAN;
        } else if (known->kind == M_PERCENT) {
            m->value = 100.0 * mean;
        } else if (known->kind == M_MIB) {
            m->value = mean / MIB;
        } else if (known->kind == M_ZERO) {
            m->value = 0.0;
        } else { /* one NVLink: an even share of the traffic, NOT_SUPPORTED beyond the active links */
            int found = 0;
            for (unsigned k = 0; k < t.g->nvlink_count && k < MAX_NVLINKS; k++)
                if (t.g->nvlinks[k].active && (int)t.g->nvlinks[k].link == known->link) found = 1;
            if (!found) m->nvmlReturn = E_NOT_SUPPORTED, m->value = NAN;
            else m->value = mean / MIB / active;
        }
        m->metricInfo.shortName = known->short_name;
        m->metricInfo.longName = known->long_name;
        m->metricInfo.unit = known->unit;
    }
    return SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * For the publisher and the tests (not part of NVML)
 */

/* Write a new body under the seqlock: the writer's side of view(). */
API void gpulens_sim_publish(void *map, const void *body, uint64_t offset, uint64_t length) {
    ShmHeader *h = map;
    uint32_t *word = events_word(h);
    uint32_t events_before = __atomic_load_n(word, __ATOMIC_RELAXED);
    uint64_t seq = __atomic_load_n(&h->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&h->seq, seq | 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy((unsigned char *)map + offset, body, length);
    __atomic_store_n(&h->seq, (seq | 1) + 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(word, __ATOMIC_RELAXED) != events_before) /* new events: wake the waits */
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sizes and offsets of the layout as this library was compiled, checked against layout.py. */
API unsigned gpulens_sim_layout(uint64_t *out, unsigned n) {
    const uint64_t values[] = {
        LAYOUT_VERSION, sizeof(ShmHeader), sizeof(GpuRec), sizeof(MigRec), sizeof(ProcRec),
        sizeof(EventRec), sizeof(NvLinkRec), sizeof(ProfileRec),
        __builtin_offsetof(ShmHeader, used_size), __builtin_offsetof(ShmHeader, driver_version),
        __builtin_offsetof(GpuRec, lost), __builtin_offsetof(GpuRec, memory_total),
        __builtin_offsetof(GpuRec, nvlinks), __builtin_offsetof(GpuRec, mig),
        __builtin_offsetof(GpuRec, profiles), __builtin_offsetof(GpuRec, name),
        __builtin_offsetof(MigRec, memory_total), __builtin_offsetof(MigRec, uuid),
        __builtin_offsetof(ProcRec, pid), __builtin_offsetof(ProcRec, name),
    };
    unsigned count = sizeof values / sizeof *values;
    for (unsigned i = 0; i < n && i < count; i++) out[i] = values[i];
    return count;
}

/* The init refcount (the reference driver's `initialized`). */
API int gpulens_sim_refcount(void) { return __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE); }
