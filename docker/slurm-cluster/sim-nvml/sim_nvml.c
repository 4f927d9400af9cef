/*
 * sim-nvml: a simulated libnvidia-ml.so.1 for the slurm-gpu test bed.
 *
 * Exports a subset of the NVML C API with the real signatures, return codes and
 * struct layouts, so the real pynvml binding loads it through LD_LIBRARY_PATH.
 * GPUs, faults and workloads live in the directory named by $SIM_NVML_DIR; see
 * README.md next to this file for the layout.
 *
 * Reference: https://docs.nvidia.com/deploy/nvml-api/ and nvml.h from the CUDA toolkit.
 * GPM (nvmlGpm*): nvml.h "GPM Structs"/"GPM Functions" (cuda-nvml-dev 12.2, as vendored in
 * github.com/NVIDIA/go-nvml pkg/nvml/nvml.h), https://docs.nvidia.com/deploy/nvml-api/
 * group__nvmlGpmFunctions.html, and the ctypes layouts of nvidia-ml-py 13.615.71
 * (pynvml.py: c_nvmlGpmMetricsGet_t, c_nvmlGpmSupport_t, NVML_GPM_METRIC_MAX = 477).
 * MIG and per-process utilization (issue #14): the NVML reference's nvmlDeviceQueries / MIG
 * groups (R550+ docs: "On MIG-enabled GPUs, querying process utilization is not currently
 * supported"; nvmlDeviceGetProcessUtilization returns NOT_FOUND when no sample is newer than
 * lastSeenTimeStamp), struct layouts from nvidia-ml-py 13.615.71 (c_nvmlProcessUtilizationSample_t,
 * c_nvmlProcessesUtilizationInfo_v1_t, ProcessesUtilizationInfo_v1 = 0x01000018), MIG profile
 * memory from `nvidia-smi mig -lgip` outputs quoted in NVIDIA/mig-parted #120 (H200) and #166
 * (B200); the per-process regression of R580 from Project-HAMi/HAMi-core #218 / HAMi #2015.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ---- NVML types (layouts as in nvml.h) ---------------------------------------- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct sim_gpu *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef nvmlProcessInfo_v2_t nvmlProcessInfo_t; /* v3 has the same layout */

typedef struct { /* nvmlPciInfo_v1_t */
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId;
} nvmlPciInfo_v1_t;

typedef struct { /* nvmlPciInfo_v2_t */
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

typedef struct { /* nvmlPciInfo_t, used by _v3 */
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { /* nvmlProcessUtilizationSample_t */
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp, us */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct { /* nvmlProcessUtilizationInfo_v1_t */
    unsigned long long timeStamp;
    unsigned int pid;
    unsigned int smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct { /* nvmlProcessesUtilizationInfo_v1_t */
    unsigned int version;             /* IN: nvmlProcessesUtilizationInfo_v1 */
    unsigned int processSamplesCount; /* IN: array size; OUT: processes */
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
#define nvmlProcessesUtilizationInfo_v1 NVML_STRUCT_VERSION(sizeof(nvmlProcessesUtilizationInfo_v1_t), 1)

_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t layout");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_v1_t) == 24, "nvmlProcessesUtilizationInfo_v1_t layout");
_Static_assert(nvmlProcessesUtilizationInfo_v1 == 0x01000018, "pynvml ProcessesUtilizationInfo_v1");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlSample_t) == 16, "nvmlSample_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");

/* GPM (nvml.h "GPM Structs"). nvmlGpmSample_t is a struct holding one pointer, passed by
 * value: the same ABI as the bare pointer pynvml passes (POINTER(struct_c_nvmlGpmSample_t)). */
struct sim_gpm_sample;
typedef struct {
    struct sim_gpm_sample *handle;
} nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;   /* IN: NVML_GPM_METRIC_? */
    nvmlReturn_t nvmlReturn; /* OUT: status of this metric; value is valid only when 0 */
    double value;            /* OUT */
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo; /* OUT: may be NULL */
} nvmlGpmMetric_t;

/* The metrics array is as long as the caller's header says (98 in CUDA 12.2's nvml.h, 477 in
 * nvidia-ml-py 13.615.71); only metrics[0 .. numMetrics-1] are ever touched, so either works. */
#define NVML_GPM_METRIC_MAX 477
typedef struct {
    unsigned int version;    /* IN: NVML_GPM_METRICS_GET_VERSION */
    unsigned int numMetrics; /* IN */
    nvmlGpmSample_t sample1; /* IN */
    nvmlGpmSample_t sample2; /* IN */
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
#define NVML_GPM_METRICS_GET_VERSION 1

typedef struct {
    unsigned int version;           /* IN: NVML_GPM_SUPPORT_VERSION */
    unsigned int isSupportedDevice; /* OUT */
} nvmlGpmSupport_t;
#define NVML_GPM_SUPPORT_VERSION 1

_Static_assert(sizeof(nvmlGpmSample_t) == sizeof(void *), "nvmlGpmSample_t is one pointer");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t layout");
_Static_assert(__builtin_offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t layout");

enum {
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1,
    NVML_GPM_METRIC_SM_UTIL = 2,
    NVML_GPM_METRIC_SM_OCCUPANCY = 3,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5,
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
    NVML_GPM_METRIC_FP64_UTIL = 11,
    NVML_GPM_METRIC_FP32_UTIL = 12,
    NVML_GPM_METRIC_FP16_UTIL = 13,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21,
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60,
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61,
};

#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_TEMPERATURE_GPU 0
#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define MIG_SLICES 7 /* compute slices of a MIG-capable GPU: a 7g instance is the whole GPU */
#define NO_INSTANCE 0xFFFFFFFFU

/* ---- simulator state ------------------------------------------------------------ */
#define MAX_GPUS 64
#define PATH_LEN 4096
#define SAMPLE_RING 120
#define HISTORY_KEEP_S 300.0 /* ended plans younger than this are never compacted */
#define COMPACT_AFTER 32     /* compact once this many old ended plans pile up */
#define RESERVED_BYTES (256ULL << 20)
#define DRIVER_VERSION "535.183.01" /* default; <node dir>/driver-version overrides it */
#define MAX_MIG 7
#define MAX_PAUSES 128 /* pauses of one plan that count; later ones are ignored */
#define PLAN_TEXT 16384 /* a plan file is read up to this size (128 pauses take about 5 KB) */

struct sim_gpu {
    unsigned int index; /* NVML enumeration index */
    unsigned int minor;
    char uuid[96];
    char name[96];
    char serial[32];
    char bus_id[32]; /* 00000000:17:00.0 */
    unsigned int domain, bus, device, function;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_total;
    unsigned int power_idle_mw, power_max_mw;
    double created;
    int gpm_supported;      /* Hopper or newer: info key gpm_supported, else derived from the model */
    unsigned int gpm_streaming; /* nvmlGpmSetStreamingEnabled state (this process only) */
    char dir[3072]; /* <SIM_NVML_DIR>/gpus/<uuid>; shorter than PATH_LEN to leave room for names */
    /* MIG: a whole GPU may hold instances; an instance is a handle of its own */
    int mig_capable;           /* A100/A30/Hopper/Blackwell data-center parts */
    int mig_mode;              /* <gpu>/mig mode=1 on a capable GPU */
    unsigned int mig_count;
    struct sim_gpu *mig[MAX_MIG];
    int is_mig;                /* this handle is a MIG device */
    struct sim_gpu *parent;
    unsigned int gi, ci, slices;
    char profile[32];
};

enum pattern { PAT_STEADY, PAT_IDLE, PAT_SPIKY, PAT_RAMP, PAT_MEMORY_ONLY };

/*
 * Activity channels a plan drives. Channel 0 is the utilization (duty cycle); every other
 * channel follows the same shape in time: level * util(t) / util. Percent channels are
 * summed over plans and clipped at 100; rate channels (MiB/s) are summed unclipped.
 */
enum channel {
    CH_UTIL,
    CH_SM,
    CH_OCCUPANCY,
    CH_TENSOR,
    CH_DRAM,
    CH_FP64,
    CH_FP32,
    CH_FP16,
    CH_PCIE_TX,
    CH_PCIE_RX,
    CH_NVLINK_RX,
    CH_NVLINK_TX,
    NCH
};
static const char *const CH_KEY[NCH] = {"util", "sm",   "occupancy", "tensor",  "dram",      "fp64",
                                        "fp32", "fp16", "pcie_tx",   "pcie_rx", "nvlink_rx", "nvlink_tx"};
static const int CH_PERCENT[NCH] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0};

struct plan {
    unsigned int pid;
    enum pattern pattern;
    double util, start, seconds, period, duty;
    double level[NCH]; /* level[CH_UTIL] == util; the others at full shape */
    double end;       /* end of utilization: min(start+seconds+paused, actual end); INFINITY if open */
    int live;         /* listed as a process: pid alive and no end written */
    unsigned long long mem_bytes;
    /* pauses (SIGSTOP .. SIGCONT): sorted, disjoint, inside [start, end); the last one may be
       open (INFINITY) while the pid is stopped. The shape runs on active (unpaused) time. */
    unsigned int npause;
    double pause_lo[MAX_PAUSES], pause_hi[MAX_PAUSES];
    char path[PATH_LEN];
};

struct plans {
    struct plan *v;
    size_t n;
    double base_until;         /* compacted history ends here */
    double base_integral[NCH]; /* integral of each channel from `created` up to base_until */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static struct sim_gpu g_gpus[MAX_GPUS];
static unsigned int g_count;
static struct sim_gpu g_migs[MAX_GPUS * MAX_MIG];
static unsigned int g_mig_total;
static char g_driver[32] = DRIVER_VERSION;
static int g_driver_major = 535;

/* fault kinds, read per call so they can be injected while a reader runs */
enum field {
    F_POWER = 1 << 0,
    F_ENERGY = 1 << 1,
    F_TEMPERATURE = 1 << 2,
    F_ECC = 1 << 3,
    F_SAMPLES = 1 << 4,
    F_UTILIZATION = 1 << 5,
    F_MEMORY = 1 << 6,
    F_PROCESSES = 1 << 7,
    F_GPM = 1 << 8,
    F_NONE = 0,
    /* not faults: what a call accepts */
    F_MIG_OK = 1 << 29,       /* the call also answers on a MIG device handle */
    F_NOT_MIG_PARENT = 1 << 30, /* NOT_SUPPORTED on a GPU in MIG mode (utilization calls) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads a small text file into buf; returns length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t r = read(fd, buf + got, size - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

static void strip(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
}

/* Finds `key=` at a line start in a key=value text; copies the value. */
static int kv_get(const char *text, const char *key, char *out, size_t size) {
    size_t klen = strlen(key);
    const char *p = text;
    while (p && *p) {
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') {
            const char *v = p + klen + 1;
            size_t n = strcspn(v, "\r\n");
            if (n >= size) n = size - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 1;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return 0;
}

static double kv_double(const char *text, const char *key, double dflt) {
    char v[64];
    return kv_get(text, key, v, sizeof v) && v[0] ? strtod(v, NULL) : dflt;
}

static int parse_bus_id(const char *s, unsigned int *dom, unsigned int *bus, unsigned int *dev,
                        unsigned int *fn) {
    return sscanf(s, "%x:%x:%x.%x", dom, bus, dev, fn) == 4;
}

/*
 * GPM is Hopper or newer (nvml.h: "For Hopper or newer fully supported devices"). Default for
 * an info file without gpm_supported (sim-gpu create writes the same rule): a Hopper or
 * Blackwell name, or a PCI device id in the Hopper (0x23xx) or Blackwell (0x29xx-0x2Bxx) range.
 */
static int model_has_gpm(const char *name, unsigned int pci_device_id) {
    static const char *const names[] = {"H100", "H200", "H800", "H20", "GH200", "B100", "B200", "B300", "GB200", "GB300"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strstr(name, names[i])) return 1;
    unsigned int dev = pci_device_id >> 16;
    return (dev >= 0x2300 && dev < 0x2400) || (dev >= 0x2900 && dev < 0x2C00);
}

/*
 * MIG is an Ampere data-center (A100, A30) or newer data-center feature (Hopper, Blackwell: H100,
 * H200, H800, H20, GH200, B100, B200, B300, GB200, GB300); L40, V100 and others answer
 * NOT_SUPPORTED to MIG calls (NVIDIA MIG user guide, "Supported GPUs").
 */
static int model_has_mig(const char *name) {
    static const char *const names[] = {"A100", "A30", "H100", "H200", "H800", "H20", "GH200",
                                        "B100", "B200", "B300", "GB200", "GB300"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strstr(name, names[i])) return 1;
    return 0;
}

/*
 * <gpu>/mig (written by `sim-gpu mig`): "mode=1" and one line per MIG device,
 * "instance=GI CI PROFILE SLICES MEMORY_MIB MIG-UUID", in MIG device index order. Each
 * instance keeps its plans and compacted history in <gpu>/gi<GI>/ as a GPU does in <gpu>/.
 */
static void load_mig(struct sim_gpu *g) {
    char path[PATH_LEN], text[4096], v[16];
    g->mig_capable = model_has_mig(g->name);
    g->mig_mode = 0;
    g->mig_count = 0;
    snprintf(path, sizeof path, "%s/mig", g->dir);
    if (!g->mig_capable || read_small(path, text, sizeof text) < 0) return;
    g->mig_mode = kv_get(text, "mode", v, sizeof v) && strcmp(v, "1") == 0;
    if (!g->mig_mode) return;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "instance=", 9) != 0 || g->mig_count >= MAX_MIG || g_mig_total >= MAX_GPUS * MAX_MIG)
            continue;
        struct sim_gpu *m = &g_migs[g_mig_total];
        memset(m, 0, sizeof *m);
        unsigned long long mib = 0;
        if (sscanf(line + 9, "%u %u %31s %u %llu %95s", &m->gi, &m->ci, m->profile, &m->slices, &mib, m->uuid) != 6)
            continue;
        m->is_mig = 1;
        m->parent = g;
        m->index = g->mig_count;
        m->minor = g->minor;
        m->memory_total = mib << 20;
        m->created = g->created;
        m->power_idle_mw = g->power_idle_mw;
        m->power_max_mw = g->power_max_mw;
        char profile[32];
        memcpy(profile, m->profile, sizeof profile);
        snprintf(m->name, sizeof m->name, "%.59s MIG %.30s", g->name, profile);
        snprintf(m->dir, sizeof m->dir, "%.3000s/gi%u", g->dir, m->gi);
        g->mig[g->mig_count++] = m;
        g_mig_total++;
    }
}

static int load_gpu(const char *root, const char *uuid, struct sim_gpu *g) {
    char path[PATH_LEN], text[4096], v[256];
    snprintf(g->dir, sizeof g->dir, "%s/gpus/%s", root, uuid);
    snprintf(path, sizeof path, "%s/info", g->dir);
    if (read_small(path, text, sizeof text) < 0) return 0;
    snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
    if (!kv_get(text, "name", g->name, sizeof g->name)) snprintf(g->name, sizeof g->name, "NVIDIA Simulated GPU");
    if (!kv_get(text, "serial", g->serial, sizeof g->serial)) snprintf(g->serial, sizeof g->serial, "0");
    if (!kv_get(text, "pci_bus_id", v, sizeof v) ||
        !parse_bus_id(v, &g->domain, &g->bus, &g->device, &g->function))
        return 0;
    snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
    g->minor = (unsigned int)kv_double(text, "minor", 0);
    g->memory_total = (unsigned long long)kv_double(text, "memory_mib", 81920) << 20;
    g->power_idle_mw = (unsigned int)kv_double(text, "power_idle_mw", 60000);
    g->power_max_mw = (unsigned int)kv_double(text, "power_max_mw", 400000);
    g->pci_device_id = (unsigned int)strtoul(kv_get(text, "pci_device_id", v, sizeof v) ? v : "0x20B210DE", NULL, 0);
    g->pci_subsystem_id = (unsigned int)strtoul(kv_get(text, "pci_subsystem_id", v, sizeof v) ? v : "0x147F10DE", NULL, 0);
    g->created = kv_double(text, "created", now_s());
    if (kv_get(text, "gpm_supported", v, sizeof v) && v[0])
        g->gpm_supported = strcmp(v, "1") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "true") == 0;
    else
        g->gpm_supported = model_has_gpm(g->name, g->pci_device_id);
    load_mig(g);
    return 1;
}

/* Reads <dir>/init-fault and the GPUs listed in <dir>/order. */
static nvmlReturn_t load_all(void) {
    const char *root = getenv("SIM_NVML_DIR");
    struct stat st;
    char path[PATH_LEN], text[65536];
    if (!root || !*root || stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(path, sizeof path, "%s/init-fault", root);
    if (read_small(path, text, sizeof text) >= 0) {
        strip(text);
        if (strcmp(text, "driver-not-loaded") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
        if (strcmp(text, "lib-rm-version-mismatch") == 0) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    g_count = 0;
    g_mig_total = 0;
    /* the driver the node runs (decides which process-utilization call works, see below) */
    snprintf(g_driver, sizeof g_driver, "%s", DRIVER_VERSION);
    snprintf(path, sizeof path, "%s/driver-version", root);
    if (read_small(path, text, sizeof text) > 0) {
        strip(text);
        if (text[0] >= '0' && text[0] <= '9') snprintf(g_driver, sizeof g_driver, "%.31s", text);
    }
    g_driver_major = atoi(g_driver);
    snprintf(path, sizeof path, "%s/order", root);
    if (read_small(path, text, sizeof text) < 0) return NVML_SUCCESS; /* a node without GPUs */
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && g_count < MAX_GPUS; line = strtok_r(NULL, "\n", &save)) {
        strip(line);
        if (!*line || strchr(line, '/')) continue;
        struct sim_gpu *g = &g_gpus[g_count];
        memset(g, 0, sizeof *g);
        if (load_gpu(root, line, g)) g->index = g_count++;
    }
    return NVML_SUCCESS;
}

/* Which fields the per-GPU fault file disables; returns 1 if the GPU is lost. */
static int read_fault(const struct sim_gpu *g, unsigned int *unsupported) {
    char path[PATH_LEN], text[1024];
    *unsupported = F_NONE;
    snprintf(path, sizeof path, "%s/fault", g->dir);
    if (read_small(path, text, sizeof text) < 0) return 0;
    strip(text);
    if (strcmp(text, "lost") == 0) return 1;
    if (strncmp(text, "not-supported=", 14) == 0) {
        static const struct { const char *name; unsigned int bit; } names[] = {
            {"power", F_POWER},       {"energy", F_ENERGY},   {"temperature", F_TEMPERATURE},
            {"ecc", F_ECC},           {"samples", F_SAMPLES}, {"utilization", F_UTILIZATION},
            {"memory", F_MEMORY},     {"processes", F_PROCESSES}, {"gpm", F_GPM},
        };
        char *save = NULL;
        for (char *f = strtok_r(text + 14, ",", &save); f; f = strtok_r(NULL, ",", &save))
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (strcmp(f, names[i].name) == 0) *unsupported |= names[i].bit;
    }
    return 0;
}

/* Common entry check for per-device calls: initialised, valid handle, not lost, field supported. */
static int valid_handle(nvmlDevice_t d) {
    return (d >= g_gpus && d < g_gpus + g_count) || (d >= g_migs && d < g_migs + g_mig_total);
}

/*
 * A MIG device shares its GPU's faults. Calls not marked F_MIG_OK answer NOT_SUPPORTED on a
 * MIG handle (power, energy, temperature, ECC, PCI, samples, utilization, GPM: NVML serves
 * those per GPU, and not at all for utilization in MIG mode).
 */
static nvmlReturn_t check_device(nvmlDevice_t d, unsigned int field) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid_handle(d)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int unsupported;
    if (read_fault(d->is_mig ? d->parent : d, &unsupported)) return NVML_ERROR_GPU_IS_LOST;
    if (unsupported & field & ~(unsigned int)(F_MIG_OK | F_NOT_MIG_PARENT)) return NVML_ERROR_NOT_SUPPORTED;
    if (d->is_mig && !(field & F_MIG_OK)) return NVML_ERROR_NOT_SUPPORTED;
    if (!d->is_mig && d->mig_mode && (field & F_NOT_MIG_PARENT)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
#define CHECK(d, field)                                        \
    do {                                                       \
        nvmlReturn_t rc_ = check_device((d), (field));         \
        if (rc_ != NVML_SUCCESS) return rc_;                   \
    } while (0)

/* ---- workload plans and their closed-form utilization integrals ------------------- */

static int pid_alive(unsigned int pid) {
    if (pid <= 1 || pid > INT_MAX) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/*
 * Fills the channels a plan (or an old base file) does not give, from its utilization:
 * sm = util, occupancy = sm / 2, tensor = 0, dram = sm / 3, fp64 = 0, fp32 = sm / 2,
 * fp16 = 0, pcie_tx = 10 * dram and pcie_rx = 20 * dram MiB/s, nvlink rx/tx = 0 MiB/s.
 * gpu-load writes the same defaults explicitly. The rule is linear, so it applies to a
 * level as well as to an integral. Percent channels are clipped to 0..100, rates to >= 0.
 */
static void derive_levels(double level[NCH]) {
    double *l = level;
    if (isnan(l[CH_SM])) l[CH_SM] = l[CH_UTIL];
    if (isnan(l[CH_OCCUPANCY])) l[CH_OCCUPANCY] = l[CH_SM] / 2.0;
    if (isnan(l[CH_TENSOR])) l[CH_TENSOR] = 0;
    if (isnan(l[CH_DRAM])) l[CH_DRAM] = l[CH_SM] / 3.0;
    if (isnan(l[CH_FP64])) l[CH_FP64] = 0;
    if (isnan(l[CH_FP32])) l[CH_FP32] = l[CH_SM] / 2.0;
    if (isnan(l[CH_FP16])) l[CH_FP16] = 0;
    if (isnan(l[CH_PCIE_TX])) l[CH_PCIE_TX] = 10.0 * l[CH_DRAM];
    if (isnan(l[CH_PCIE_RX])) l[CH_PCIE_RX] = 20.0 * l[CH_DRAM];
    if (isnan(l[CH_NVLINK_RX])) l[CH_NVLINK_RX] = 0;
    if (isnan(l[CH_NVLINK_TX])) l[CH_NVLINK_TX] = 0;
}

static void clip_levels(double level[NCH]) {
    for (int c = 0; c < NCH; c++) level[c] = CH_PERCENT[c] ? fmin(100.0, fmax(0.0, level[c])) : fmax(0.0, level[c]);
}

/* Whether the pid is stopped now (SIGSTOP, as `scontrol suspend` does): /proc/<pid>/stat state
   'T' (stopped) or 't' (tracing stop). The state follows the command, which may hold ')'. */
static int pid_stopped(unsigned int pid) {
    char path[64], text[1024];
    if (pid <= 1 || pid > INT_MAX) return 0;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    if (read_small(path, text, sizeof text) <= 0) return 0;
    const char *p = strrchr(text, ')');
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* Adds the pause [lo, hi) to the plan's list, kept sorted and merged; clipped to the start. */
static void add_pause(struct plan *p, double lo, double hi) {
    lo = fmax(lo, p->start);
    if (!(hi > lo)) return;
    unsigned int i = 0;
    while (i < p->npause && p->pause_hi[i] < lo) i++;
    if (i < p->npause && p->pause_lo[i] <= hi) { /* overlaps or touches pause i: merge */
        p->pause_lo[i] = fmin(p->pause_lo[i], lo);
        p->pause_hi[i] = fmax(p->pause_hi[i], hi);
        unsigned int j = i + 1;
        while (j < p->npause && p->pause_lo[j] <= p->pause_hi[i]) p->pause_hi[i] = fmax(p->pause_hi[i], p->pause_hi[j++]);
        memmove(&p->pause_lo[i + 1], &p->pause_lo[j], (p->npause - j) * sizeof p->pause_lo[0]);
        memmove(&p->pause_hi[i + 1], &p->pause_hi[j], (p->npause - j) * sizeof p->pause_hi[0]);
        p->npause -= j - (i + 1);
        return;
    }
    if (p->npause >= MAX_PAUSES) return;
    memmove(&p->pause_lo[i + 1], &p->pause_lo[i], (p->npause - i) * sizeof p->pause_lo[0]);
    memmove(&p->pause_hi[i + 1], &p->pause_hi[i], (p->npause - i) * sizeof p->pause_hi[0]);
    p->pause_lo[i] = lo;
    p->pause_hi[i] = hi;
    p->npause++;
}

/* `pauses=<lo>:<hi>,<lo>:<hi>,...` (epoch seconds, the first MAX_PAUSES count). */
static void parse_pauses(const char *text, struct plan *p) {
    const char *v = NULL;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, "pauses=", 7) == 0) {
            v = line + 7;
            break;
        }
    for (unsigned int seen = 0; v && *v && *v != '\n' && *v != '\r' && seen < MAX_PAUSES; seen++) {
        char *e1, *e2;
        double lo = strtod(v, &e1);
        if (e1 == v || *e1 != ':') break;
        double hi = strtod(e1 + 1, &e2);
        if (e2 == e1 + 1 || (*e2 != ',' && *e2 != '\n' && *e2 != '\r' && *e2 != '\0')) break;
        add_pause(p, lo, hi);
        v = *e2 == ',' ? e2 + 1 : NULL;
    }
}

static int parse_plan(const char *path, struct plan *p) {
    char text[PLAN_TEXT], v[64];
    struct stat st;
    if (stat(path, &st) != 0 || read_small(path, text, sizeof text) <= 0) return 0;
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->pid = (unsigned int)kv_double(text, "pid", 0);
    p->start = kv_double(text, "start", NAN);
    if (isnan(p->start)) return 0;
    p->util = fmin(100.0, fmax(0.0, kv_double(text, "util", 0)));
    p->seconds = kv_double(text, "seconds", 0);
    p->period = kv_double(text, "period", 60);
    p->duty = fmin(1.0, fmax(0.0, kv_double(text, "duty", 0.5)));
    p->mem_bytes = (unsigned long long)(kv_double(text, "mem_mib", 0) * 1048576.0);
    kv_get(text, "pattern", v, sizeof v);
    p->pattern = strcmp(v, "idle") == 0          ? PAT_IDLE
                 : strcmp(v, "spiky") == 0       ? PAT_SPIKY
                 : strcmp(v, "ramp") == 0        ? PAT_RAMP
                 : strcmp(v, "memory-only") == 0 ? PAT_MEMORY_ONLY
                                                 : PAT_STEADY;
    int fake_busy = strcmp(v, "fake-busy") == 0; /* steady shape, tiny SM activity */
    if (p->pattern == PAT_IDLE || p->pattern == PAT_MEMORY_ONLY) p->util = 0;
    if (p->pattern == PAT_SPIKY && p->period <= 0) p->pattern = PAT_STEADY;
    p->level[CH_UTIL] = p->util;
    for (int c = 1; c < NCH; c++) p->level[c] = kv_double(text, CH_KEY[c], NAN);
    if (fake_busy && isnan(p->level[CH_SM])) p->level[CH_SM] = 1.0;
    derive_levels(p->level);
    clip_levels(p->level);
    double mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
    parse_pauses(text, p);
    double ended = kv_double(text, "end", NAN);
    if (isnan(ended)) {
        if (pid_alive(p->pid)) {
            ended = INFINITY;
            p->live = 1;
            /* stopped now (suspended): paused since its last heartbeat, until it resumes */
            if (pid_stopped(p->pid)) add_pause(p, mtime, INFINITY);
        } else {
            /* killed without a chance to write its end (SIGKILL): the last heartbeat */
            ended = mtime;
        }
    }
    /* --seconds is active time: every pause that begins before the run is over delays its end */
    double until = p->seconds > 0 ? p->start + p->seconds : INFINITY;
    for (unsigned int i = 0; i < p->npause && p->pause_lo[i] < until; i++) until += p->pause_hi[i] - p->pause_lo[i];
    p->end = fmin(ended, until);
    if (p->end < p->start) p->end = p->start;
    while (p->npause > 0 && p->pause_lo[p->npause - 1] >= p->end) p->npause--; /* after the end: nothing to pause */
    return 1;
}

/* Active (unpaused) seconds of the plan from its start to t; t is clipped to [start, end]. */
static double active_time(const struct plan *p, double t) {
    t = fmin(fmax(t, p->start), p->end);
    double x = t - p->start;
    for (unsigned int i = 0; i < p->npause && p->pause_lo[i] < t; i++) x -= fmin(t, p->pause_hi[i]) - p->pause_lo[i];
    return fmax(0.0, x);
}

/* The index of the pause holding t, or -1. */
static int pause_at(const struct plan *p, double t) {
    for (unsigned int i = 0; i < p->npause && p->pause_lo[i] <= t; i++)
        if (t < p->pause_hi[i]) return (int)i;
    return -1;
}

/*
 * Instantaneous utilization and slope of one plan at t (right-continuous). The shape is a
 * function of the active time x: a paused process does no work (0), and resumes where it was.
 */
static double plan_value(const struct plan *p, double t, double *slope) {
    *slope = 0;
    if (t < p->start || t >= p->end || p->util <= 0 || pause_at(p, t) >= 0) return 0;
    double x = active_time(p, t);
    switch (p->pattern) {
    case PAT_SPIKY: {
        double r = fmod(x, p->period);
        return r < p->duty * p->period ? p->util : 0;
    }
    case PAT_RAMP:
        if (p->seconds <= 0) return 0;
        *slope = p->util / p->seconds;
        return p->util * x / p->seconds;
    case PAT_STEADY:
        return p->util;
    default:
        return 0;
    }
}

/* Integral of the spike train from the plan start over x seconds. */
static double spiky_cum(const struct plan *p, double x) {
    double k = floor(x / p->period);
    double r = x - k * p->period;
    return p->util * (k * p->duty * p->period + fmin(r, p->duty * p->period));
}

/* Integral of the shape over the first x active seconds, in percent-seconds. */
static double shape_cum(const struct plan *p, double x) {
    switch (p->pattern) {
    case PAT_STEADY:
        return p->util * x;
    case PAT_SPIKY:
        return spiky_cum(p, x);
    case PAT_RAMP:
        return p->seconds > 0 ? p->util * x * x / (2 * p->seconds) : 0;
    default:
        return 0;
    }
}

/*
 * Closed-form integral of one plan's utilization over [a, b], in percent-seconds. Paused
 * time adds nothing and does not advance the shape, so the integral is that of the shape over
 * the active time that passed: shape_cum(x(b)) - shape_cum(x(a)).
 */
static double plan_integral(const struct plan *p, double a, double b) {
    double lo = fmax(a, p->start), hi = fmin(b, p->end);
    if (hi <= lo || p->util <= 0) return 0;
    return shape_cum(p, active_time(p, hi)) - shape_cum(p, active_time(p, lo));
}

/* Next time after t where the plan's utilization changes its formula. */
static double plan_next_break(const struct plan *p, double t) {
    if (t < p->start) return p->start;
    if (t >= p->end) return INFINITY;
    double next = p->end;
    int in = pause_at(p, t);
    if (in >= 0) return fmin(next, p->pause_hi[in]);
    for (unsigned int i = 0; i < p->npause; i++)
        if (p->pause_lo[i] > t) {
            next = fmin(next, p->pause_lo[i]);
            break;
        }
    if (p->pattern == PAT_SPIKY) { /* in active time x, mapped back: t advances with x until the next pause */
        double x = active_time(p, t);
        double k = floor(x / p->period);
        double up = k * p->period, down = up + p->duty * p->period;
        double cand = x < down ? down : up + p->period;
        if (cand <= x) cand = up + p->period;
        next = fmin(next, t + (cand - x));
    }
    return next;
}

/* A channel of a plan is its utilization shape scaled: level[c] * util(t) / util. */
static double channel_scale(const struct plan *p, int c) {
    return p->util > 0 ? p->level[c] / p->util : 0;
}

/*
 * Integral of a channel over [a, b]: the sum over plans, clipped at 100 for a percent channel
 * (a GPU cannot be busier than 100%), unclipped for a rate.
 */
static double channel_integral(const struct plans *ps, int c, double a, double b) {
    if (b <= a) return 0;
    double peak = 0, sum = 0;
    for (size_t i = 0; i < ps->n; i++)
        if (ps->v[i].end > a && ps->v[i].start < b && ps->v[i].util > 0) peak += ps->v[i].level[c];
    if (!CH_PERCENT[c] || peak <= 100.0) { /* no overlap can exceed 100%: plain sum of closed forms */
        for (size_t i = 0; i < ps->n; i++) {
            double k = channel_scale(&ps->v[i], c);
            if (k > 0) sum += k * plan_integral(&ps->v[i], a, b);
        }
        return sum;
    }
    /* Between breakpoints every plan is linear, so the total is linear; clip it at 100. */
    double t = a;
    for (int guard = 0; t < b && guard < 10000000; guard++) {
        double n = b;
        for (size_t i = 0; i < ps->n; i++) n = fmin(n, plan_next_break(&ps->v[i], t));
        if (n <= t) n = t + 1e-6;
        double m = 0.5 * (t + n), fm = 0, slope = 0;
        for (size_t i = 0; i < ps->n; i++) {
            double s, k = channel_scale(&ps->v[i], c);
            fm += k * plan_value(&ps->v[i], m, &s);
            slope += k * s;
        }
        double f0 = fm + slope * (t - m), f1 = fm + slope * (n - m);
        if (f0 <= 100 && f1 <= 100) {
            sum += 0.5 * (f0 + f1) * (n - t);
        } else if (f0 >= 100 && f1 >= 100) {
            sum += 100 * (n - t);
        } else {
            double xc = t + (100 - f0) / (f1 - f0) * (n - t);
            if (f0 < 100)
                sum += 0.5 * (f0 + 100) * (xc - t) + 100 * (n - xc);
            else
                sum += 100 * (xc - t) + 0.5 * (100 + f1) * (n - xc);
        }
        t = n;
    }
    return sum;
}

static double util_integral(const struct plans *ps, double a, double b) {
    return channel_integral(ps, CH_UTIL, a, b);
}

static double util_instant(const struct plans *ps, double t) {
    double sum = 0, s;
    for (size_t i = 0; i < ps->n; i++) sum += plan_value(&ps->v[i], t, &s);
    return fmin(100.0, sum);
}

static void free_plans(struct plans *ps) {
    free(ps->v);
    ps->v = NULL;
    ps->n = 0;
}

static void read_plans(const struct sim_gpu *g, struct plans *ps) {
    char path[3200], text[1024];
    ps->v = NULL;
    ps->n = 0;
    ps->base_until = g->created;
    for (int c = 0; c < NCH; c++) ps->base_integral[c] = 0;
    snprintf(path, sizeof path, "%s/base", g->dir);
    if (read_small(path, text, sizeof text) > 0) {
        char key[64];
        ps->base_until = kv_double(text, "until", g->created);
        for (int c = 0; c < NCH; c++) {
            snprintf(key, sizeof key, "%s_integral", CH_KEY[c]);
            ps->base_integral[c] = kv_double(text, key, c == CH_UTIL ? 0 : NAN);
        }
        derive_levels(ps->base_integral); /* a base written before GPM: the plans' default rule */
    }
    snprintf(path, sizeof path, "%s/plans", g->dir);
    DIR *dir = opendir(path);
    if (!dir) return;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 6 || strcmp(e->d_name + len - 5, ".plan") != 0) continue;
        if (ps->n == cap) {
            cap = cap ? cap * 2 : 16;
            struct plan *nv = realloc(ps->v, cap * sizeof *nv);
            if (!nv) break;
            ps->v = nv;
        }
        char full[PATH_LEN];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (parse_plan(full, &ps->v[ps->n])) ps->n++;
    }
    closedir(dir);
}

/*
 * Folds plans that ended long ago into <gpu>/base so each call reads few files.
 * Best effort: a reader without write access simply keeps reading the full history.
 * Correct under races: the integral only ever starts at base_until, so a plan
 * that was folded in but not yet removed adds nothing.
 */
static void maybe_compact(const struct sim_gpu *g, struct plans *ps, double now) {
    double cut = now - HISTORY_KEEP_S;
    size_t old = 0;
    for (size_t i = 0; i < ps->n; i++)
        if (!ps->v[i].live && ps->v[i].end < cut) old++;
    if (old < COMPACT_AFTER || cut <= ps->base_until) return;
    char lock[PATH_LEN], tmp[PATH_LEN], base[PATH_LEN];
    snprintf(lock, sizeof lock, "%s/base.lock", g->dir);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return;
    }
    struct plans fresh;
    read_plans(g, &fresh); /* re-read under the lock: another process may have compacted */
    if (cut > fresh.base_until) {
        snprintf(tmp, sizeof tmp, "%s/.base.%d", g->dir, (int)getpid());
        snprintf(base, sizeof base, "%s/base", g->dir);
        FILE *f = fopen(tmp, "w");
        if (f) {
            /* every channel folds the same way, so GPM samples taken on either side of a
               compaction still differ by exactly the integral between them */
            fprintf(f, "until=%.6f\n", cut);
            for (int c = 0; c < NCH; c++)
                fprintf(f, "%s_integral=%.6f\n", CH_KEY[c],
                        fresh.base_integral[c] + channel_integral(&fresh, c, fresh.base_until, cut));
            if (fclose(f) == 0 && rename(tmp, base) == 0) {
                for (size_t i = 0; i < fresh.n; i++)
                    if (!fresh.v[i].live && fresh.v[i].end < cut) unlink(fresh.v[i].path);
            } else {
                unlink(tmp);
            }
        }
    }
    free_plans(&fresh);
    flock(fd, LOCK_UN);
    close(fd);
    free_plans(ps);
    read_plans(g, ps);
}

static void load_plans(const struct sim_gpu *g, struct plans *ps, double now) {
    read_plans(g, ps);
    maybe_compact(g, ps, now);
}

static unsigned long long used_memory(const struct plans *ps) {
    unsigned long long used = 0;
    for (size_t i = 0; i < ps->n; i++)
        if (ps->v[i].live) used += ps->v[i].mem_bytes;
    return used;
}

/* ---- a whole GPU = its own plans + its MIG instances' -------------------------------- */
/*
 * A MIG instance of S slices is S/7 of the GPU's compute: on the whole GPU its percent
 * channels count S/7 of their value (a 3g instance at 100% SM keeps 3/7 of the SMs busy); its
 * rates (MiB/s) count in full. Each source integrates from its own compacted base.
 */
static double mig_weight(const struct sim_gpu *m, int c) {
    return CH_PERCENT[c] ? (double)m->slices / MIG_SLICES : 1.0;
}

/* Integral of channel c of d's own plans from `created` to now (compacted history included). */
static double own_cum(const struct sim_gpu *d, int c, double now) {
    struct plans ps;
    load_plans(d, &ps, now);
    double from = fmax(ps.base_until, d->created);
    double v = ps.base_integral[c] + channel_integral(&ps, c, from, now);
    free_plans(&ps);
    return v;
}

static double whole_cum(const struct sim_gpu *d, int c, double now) {
    double v = own_cum(d, c, now);
    for (unsigned int i = 0; i < d->mig_count; i++) v += mig_weight(d->mig[i], c) * own_cum(d->mig[i], c, now);
    return v;
}

/* Utilization of the whole GPU at this instant (power, temperature). */
static double whole_instant(const struct sim_gpu *d, double now) {
    struct plans ps;
    load_plans(d, &ps, now);
    double u = util_instant(&ps, now);
    free_plans(&ps);
    for (unsigned int i = 0; i < d->mig_count; i++) {
        load_plans(d->mig[i], &ps, now);
        u += mig_weight(d->mig[i], CH_UTIL) * util_instant(&ps, now);
        free_plans(&ps);
    }
    return fmin(100.0, u);
}

/* Memory of the live processes of d (a MIG device: of that instance; a GPU: all of them). */
static unsigned long long whole_used(const struct sim_gpu *d, double now) {
    struct plans ps;
    load_plans(d, &ps, now);
    unsigned long long used = used_memory(&ps);
    free_plans(&ps);
    for (unsigned int i = 0; i < d->mig_count; i++) used += whole_used(d->mig[i], now);
    return used;
}

/* ---- init / system --------------------------------------------------------------- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount == 0) rc = load_all();
    if (rc == NVML_SUCCESS) g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount <= 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *buf, unsigned int length, const char *value) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, g_driver);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char v[48]; /* "12.535.183.01"; R580 ships NVML 13 */
    snprintf(v, sizeof v, "%d.%s", g_driver_major >= 580 ? 13 : 12, g_driver);
    return copy_str(version, length, v);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    /* the CUDA version each driver branch reports (535: 12.2, 550: 12.4, 570: 12.8, 580: 13.0) */
    *cudaDriverVersion = g_driver_major >= 580 ? 13000 : g_driver_major >= 570 ? 12080 : g_driver_major >= 550 ? 12040 : 12020;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device enumeration ------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_count;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_count; i++)
        if (strcasecmp(g_gpus[i].uuid, uuid) == 0) {
            *device = &g_gpus[i];
            return NVML_SUCCESS;
        }
    for (unsigned int i = 0; i < g_mig_total; i++) /* a MIG device's UUID gives its MIG handle */
        if (strcasecmp(g_migs[i].uuid, uuid) == 0) {
            *device = &g_migs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    if (g_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    unsigned int dom, bus, dev, fn;
    if (!pciBusId || !device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!parse_bus_id(pciBusId, &dom, &bus, &dev, &fn)) {
        dom = 0; /* "17:00.0" short form */
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &dev, &fn) != 3) return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < g_count; i++) {
        struct sim_gpu *g = &g_gpus[i];
        if (g->domain == dom && g->bus == bus && g->device == dev && g->function == fn) {
            *device = g;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- device identity ---------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    CHECK(device, F_MIG_OK); /* a MIG device: "<GPU name> MIG 3g.40gb" */
    return copy_str(name, length, device->name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    CHECK(device, F_MIG_OK);
    return copy_str(uuid, length, device->uuid);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    CHECK(device, F_NONE);
    return copy_str(serial, length, device->serial);
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    CHECK(device, F_NONE);
    if (!minorNumber) return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    CHECK(device, F_NONE);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

static void legacy_bus_id(const struct sim_gpu *g, char out[16]) {
    snprintf(out, 16, "%04X:%02X:%02X.%X", g->domain & 0xFFFF, g->bus & 0xFF, g->device & 0xFF, g->function & 0xF);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    CHECK(device, F_NONE);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    legacy_bus_id(device, pci->busIdLegacy);
    snprintf(pci->busId, sizeof pci->busId, "%s", device->bus_id);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci) {
    CHECK(device, F_NONE);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    legacy_bus_id(device, pci->busId);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v1_t *pci) {
    CHECK(device, F_NONE);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    legacy_bus_id(device, pci->busId);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = device->pci_device_id;
    return NVML_SUCCESS;
}

/* ---- MIG ------------------------------------------------------------------------------ */
/*
 * Layouts come from <gpu>/mig (read at nvmlInit, like the GPU list); the pending mode is the
 * current one (no reset is ever pending). On a GPU without MIG every call below answers
 * NVML_ERROR_NOT_SUPPORTED (nvml.h: "if device doesn't support this feature").
 */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    CHECK(device, F_NONE);
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = device->mig_mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = *currentMode;
    return NVML_SUCCESS;
}

/* nvml.h: "Returns zero if MIG is not supported or enabled"; 7 on a GPU in MIG mode. */
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    CHECK(device, F_NONE);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *count = device->mig_mode ? MAX_MIG : 0;
    return NVML_SUCCESS;
}

/* nvml.h: INVALID_ARGUMENT for an index beyond the maximum, NOT_FOUND if no MIG device there. */
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    CHECK(device, F_NONE);
    if (!migDevice) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= (device->mig_mode ? MAX_MIG : 0U)) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= device->mig_count) return NVML_ERROR_NOT_FOUND;
    *migDevice = device->mig[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    CHECK(device, F_MIG_OK);
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = device->is_mig ? 1U : 0U;
    return NVML_SUCCESS;
}

/* Instance ids exist on MIG devices only; a GPU handle answers NOT_SUPPORTED (not verified). */
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    CHECK(device, F_MIG_OK);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = device->gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    CHECK(device, F_MIG_OK);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = device->ci;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    CHECK(migDevice, F_MIG_OK);
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!migDevice->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *device = migDevice->parent;
    return NVML_SUCCESS;
}

/* ---- memory --------------------------------------------------------------------------- */

/* A MIG device's memory is its profile's (nothing reserved in it); a GPU's includes its instances'. */
static void memory_numbers(nvmlDevice_t d, unsigned long long *used, unsigned long long *reserved) {
    unsigned long long total = d->memory_total;
    *reserved = d->is_mig ? 0 : RESERVED_BYTES < total ? RESERVED_BYTES : total;
    *used = whole_used(d, now_s());
    if (*used > total - *reserved) *used = total - *reserved;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    CHECK(device, F_MEMORY | F_MIG_OK);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used, reserved;
    memory_numbers(device, &used, &reserved);
    memory->total = device->memory_total;
    memory->used = used;
    memory->free = device->memory_total - used - reserved;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    CHECK(device, F_MEMORY | F_MIG_OK);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used, reserved;
    memory_numbers(device, &used, &reserved);
    memory->total = device->memory_total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = device->memory_total - used - reserved;
    return NVML_SUCCESS;
}

/* ---- utilization, samples, power, energy, temperature ------------------------------- */

static unsigned int round_pct(double v) {
    v = fmin(100.0, fmax(0.0, v));
    return (unsigned int)lround(v);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    CHECK(device, F_UTILIZATION | F_NOT_MIG_PARENT); /* MIG mode: NOT_SUPPORTED (nvidia-smi: N/A) */
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    struct plans ps;
    double now = now_s();
    load_plans(device, &ps, now);
    double gpu = util_integral(&ps, now - 1.0, now); /* mean over the last second */
    free_plans(&ps);
    utilization->gpu = round_pct(gpu);
    utilization->memory = round_pct(gpu / 2.0);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type, unsigned long long lastSeenTimeStamp,
                                      int *sampleValType, unsigned int *sampleCount, nvmlSample_t *samples) {
    CHECK(device, F_SAMPLES | F_NOT_MIG_PARENT);
    if (!sampleValType || !sampleCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES) return NVML_ERROR_NOT_SUPPORTED;
    double now = now_s();
    long long last = (long long)floor(now);
    /* one sample per whole second t, covering (t-1, t]; the last SAMPLE_RING are kept */
    long long first = last - SAMPLE_RING + 1;
    long long created = (long long)floor(device->created) + 1;
    if (first < created) first = created;
    long long seen = (long long)(lastSeenTimeStamp / 1000000ULL); /* samples are on whole seconds */
    if (first <= seen) first = seen + 1;
    unsigned int n = last >= first ? (unsigned int)(last - first + 1) : 0;
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (n == 0) {
        *sampleCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!samples) {
        *sampleCount = n;
        return NVML_SUCCESS;
    }
    /* A second may have ticked since the size query: return the oldest that fit. */
    if (*sampleCount < n) n = *sampleCount;
    struct plans ps;
    load_plans(device, &ps, now);
    for (unsigned int i = 0; i < n; i++) {
        long long t = first + i;
        samples[i].timeStamp = (unsigned long long)t * 1000000ULL;
        samples[i].sampleValue.ullVal = 0;
        samples[i].sampleValue.uiVal = round_pct(util_integral(&ps, (double)t - 1.0, (double)t));
    }
    free_plans(&ps);
    *sampleCount = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    CHECK(device, F_POWER);
    if (!power) return NVML_ERROR_INVALID_ARGUMENT;
    double u = whole_instant(device, now_s());
    *power = device->power_idle_mw + (unsigned int)llround((device->power_max_mw - device->power_idle_mw) * u / 100.0);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    CHECK(device, F_POWER);
    if (!limit) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = device->power_max_mw;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    CHECK(device, F_ENERGY);
    if (!energy) return NVML_ERROR_INVALID_ARGUMENT;
    double now = now_s();
    double util_ps = whole_cum(device, CH_UTIL, now); /* percent-seconds */
    double mj = device->power_idle_mw * fmax(0.0, now - device->created) +
                (device->power_max_mw - device->power_idle_mw) * util_ps / 100.0;
    *energy = (unsigned long long)llround(mj);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp) {
    CHECK(device, F_TEMPERATURE);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    double u = whole_instant(device, now_s());
    *temp = (unsigned int)lround(30.0 + 0.4 * u);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                             unsigned long long *eccCounts) {
    CHECK(device, F_ECC);
    if (!eccCounts || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    char path[PATH_LEN], text[512];
    snprintf(path, sizeof path, "%s/ecc", device->dir);
    *eccCounts = 0;
    if (read_small(path, text, sizeof text) > 0)
        *eccCounts = (unsigned long long)kv_double(text, errorType == 0 ? "corrected" : "uncorrected", 0);
    return NVML_SUCCESS;
}

/* ---- processes ------------------------------------------------------------------------ */

/*
 * NVML's two-call protocol: *infoCount in = capacity, out = processes (needed or written).
 * A GPU lists its own processes (no instance: 0xFFFFFFFF) and then those of each MIG
 * instance with its gpuInstanceId/computeInstanceId; a MIG device lists its instance's.
 */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, size_t stride,
                                   int with_instances) {
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_gpu *src[1 + MAX_MIG];
    unsigned int nsrc = 0;
    src[nsrc++] = device;
    for (unsigned int i = 0; i < device->mig_count; i++) src[nsrc++] = device->mig[i];
    struct plans ps[1 + MAX_MIG];
    double now = now_s();
    unsigned int n = 0;
    for (unsigned int s = 0; s < nsrc; s++) {
        load_plans(src[s], &ps[s], now);
        for (size_t i = 0; i < ps[s].n; i++) n += ps[s].v[i].live ? 1U : 0U;
    }
    nvmlReturn_t rc = NVML_SUCCESS;
    if (*infoCount < n) {
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && !infos) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        unsigned int k = 0;
        for (unsigned int s = 0; s < nsrc; s++) {
            unsigned int gi = src[s]->is_mig ? src[s]->gi : NO_INSTANCE;
            unsigned int ci = src[s]->is_mig ? src[s]->ci : NO_INSTANCE;
            for (size_t i = 0; i < ps[s].n; i++) {
                const struct plan *p = &ps[s].v[i];
                if (!p->live) continue;
                char *slot = (char *)infos + stride * k++;
                if (with_instances) {
                    nvmlProcessInfo_v2_t info = {p->pid, p->mem_bytes, gi, ci};
                    memcpy(slot, &info, sizeof info);
                } else {
                    nvmlProcessInfo_v1_t info = {p->pid, p->mem_bytes};
                    memcpy(slot, &info, sizeof info);
                }
            }
        }
    }
    for (unsigned int s = 0; s < nsrc; s++) free_plans(&ps[s]);
    *infoCount = n;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos) {
    CHECK(device, F_PROCESSES | F_MIG_OK);
    return list_processes(device, infoCount, infos, sizeof(nvmlProcessInfo_t), 1);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v2_t *infos) {
    CHECK(device, F_PROCESSES | F_MIG_OK);
    return list_processes(device, infoCount, infos, sizeof(nvmlProcessInfo_v2_t), 1);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v1_t *infos) {
    CHECK(device, F_PROCESSES | F_MIG_OK);
    return list_processes(device, infoCount, infos, sizeof(nvmlProcessInfo_v1_t), 0);
}

/* The simulated GPUs run no graphics contexts. */
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_t *infos) {
    CHECK(device, F_PROCESSES | F_MIG_OK);
    (void)infos;
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

/* ---- per-process utilization (shared GPUs: gres/shard, MPS, time slicing) ------------ */
/*
 * One sample per live process per whole second T (timestamp T * 10^6 us): smUtil = the mean of
 * that process' own utilization over (T-1, T] (the GPU's is their sum, capped at 100), memUtil
 * = smUtil / 2 (as the GPU's memory utilization is half its utilization), enc/dec/jpg/ofa 0.
 * Only the newest second is returned, and only if T * 10^6 > lastSeenTimeStamp, else
 * NVML_ERROR_NOT_FOUND (nvml.h: "If no valid sample entries are found since the
 * lastSeenTimeStamp, NVML_ERROR_NOT_FOUND is returned"); a process that started within the
 * second has no sample yet. Size query: a NULL array (or too small a count) returns
 * NVML_ERROR_INSUFFICIENT_SIZE with the count needed, as pynvml's callers expect. MIG: NOT_SUPPORTED
 * on a MIG device and on a GPU in MIG mode (nvml.h: "On MIG-enabled GPUs, querying process
 * utilization is not currently supported").
 *
 * Driver version (<node dir>/driver-version, default 535.183.01):
 *   < 550: nvmlDeviceGetProcessesUtilizationInfo answers NVML_ERROR_FUNCTION_NOT_FOUND (the call
 *          came with R550; pynvml raises NVMLError_FunctionNotFound as for a missing symbol).
 *   >= 580: nvmlDeviceGetProcessUtilization still lists the processes but with smUtil = memUtil
 *          = 0, while the new call has the values: what Project-HAMi/HAMi-core #218 (HAMi
 *          #2015) reports on 580.159.03 (seen on Blackwell; the simulator applies it by driver
 *          version, on every model; not verified which of the two decides on hardware).
 */
struct proc_sample {
    unsigned int pid, sm, mem;
};

static nvmlReturn_t process_samples(nvmlDevice_t device, unsigned long long lastSeen, struct proc_sample **out,
                                    unsigned int *count, unsigned long long *stamp) {
    *out = NULL;
    *count = 0;
    double now = now_s();
    long long t = (long long)floor(now);
    *stamp = (unsigned long long)t * 1000000ULL;
    if (*stamp <= lastSeen || (double)t <= device->created) return NVML_ERROR_NOT_FOUND;
    struct plans ps;
    load_plans(device, &ps, now);
    struct proc_sample *v = calloc(ps.n ? ps.n : 1, sizeof *v);
    if (!v) {
        free_plans(&ps);
        return NVML_ERROR_MEMORY;
    }
    unsigned int n = 0;
    for (size_t i = 0; i < ps.n; i++) {
        const struct plan *p = &ps.v[i];
        if (!p->live || p->start > (double)t - 1.0) continue;
        struct plans one = {.v = (struct plan *)p, .n = 1};
        double u = channel_integral(&one, CH_UTIL, (double)t - 1.0, (double)t);
        v[n].pid = p->pid;
        v[n].sm = round_pct(u);
        v[n].mem = round_pct(u / 2.0);
        n++;
    }
    free_plans(&ps);
    if (n == 0) {
        free(v);
        return NVML_ERROR_NOT_FOUND;
    }
    *out = v;
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp) {
    CHECK(device, F_UTILIZATION | F_NOT_MIG_PARENT);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc_sample *v;
    unsigned int n;
    unsigned long long stamp;
    nvmlReturn_t rc = process_samples(device, lastSeenTimeStamp, &v, &n, &stamp);
    if (rc != NVML_SUCCESS) {
        *processSamplesCount = 0;
        return rc;
    }
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        free(v);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    int zeroed = g_driver_major >= 580; /* see above: R580 answers 0 from the old call */
    for (unsigned int i = 0; i < n; i++) {
        nvmlProcessUtilizationSample_t x = {v[i].pid, stamp, zeroed ? 0 : v[i].sm, zeroed ? 0 : v[i].mem, 0, 0};
        utilization[i] = x;
    }
    *processSamplesCount = n;
    free(v);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_v1_t *procesesUtilInfo) {
    if (g_refcount > 0 && g_driver_major < 550) return NVML_ERROR_FUNCTION_NOT_FOUND;
    CHECK(device, F_UTILIZATION | F_NOT_MIG_PARENT);
    nvmlProcessesUtilizationInfo_v1_t *info = procesesUtilInfo;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct proc_sample *v;
    unsigned int n;
    unsigned long long stamp;
    nvmlReturn_t rc = process_samples(device, info->lastSeenTimeStamp, &v, &n, &stamp);
    if (rc != NVML_SUCCESS) {
        info->processSamplesCount = 0;
        return rc;
    }
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        free(v);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t x = {stamp, v[i].pid, v[i].sm, v[i].mem, 0, 0, 0, 0};
        info->procUtilArray[i] = x;
    }
    info->processSamplesCount = n;
    free(v);
    return NVML_SUCCESS;
}

/* ---- GPM: GPU performance monitoring (Hopper or newer) ------------------------------ */
/*
 * A sample is what a hardware counter would hold: its time and, per channel, the integral of
 * the channel from the GPU's `created` up to that time (compacted history included). The
 * metrics between two samples are the differences divided by the time between them: the
 * exact time-weighted mean of what the workload did in (t1, t2], whatever the gap.
 */
#define GPM_SAMPLE_MAGIC 0x47504D53U /* "GPMS" */

struct sim_gpm_sample {
    unsigned int magic;
    int filled;     /* set by nvmlGpmSampleGet */
    char uuid[96];  /* the GPU it was taken on (handles may move across a re-init) */
    double t;       /* epoch seconds */
    double cum[NCH];
    struct sim_gpm_sample *next; /* registry of live samples, so a stale handle is refused */
};

static pthread_mutex_t g_gpm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_gpm_sample *g_gpm_samples;

static int sample_known(const struct sim_gpm_sample *s) {
    int found = 0;
    pthread_mutex_lock(&g_gpm_lock);
    for (const struct sim_gpm_sample *x = g_gpm_samples; x && !found; x = x->next) found = x == s;
    pthread_mutex_unlock(&g_gpm_lock);
    return found && s->magic == GPM_SAMPLE_MAGIC;
}

static const struct {
    unsigned int id;
    int channel;
    char *short_name, *long_name, *unit;
} GPM_METRICS[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, CH_UTIL, "gr_util", "graphics/compute engine activity", "%"},
    {NVML_GPM_METRIC_SM_UTIL, CH_SM, "sm_util", "SM activity", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, CH_OCCUPANCY, "sm_occupancy", "SM occupancy", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, CH_TENSOR, "any_tensor_util", "tensor pipe activity (any)", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, CH_DRAM, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, CH_FP64, "fp64_util", "FP64 pipe activity", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, CH_FP32, "fp32_util", "FP32 pipe activity", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, CH_FP16, "fp16_util", "FP16 pipe activity", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, CH_PCIE_TX, "pcie_tx", "PCIe traffic from the GPU", "MiB/sec"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, CH_PCIE_RX, "pcie_rx", "PCIe traffic to the GPU", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, CH_NVLINK_RX, "nvlink_rx", "NVLink read bandwidth, all links", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, CH_NVLINK_TX, "nvlink_tx", "NVLink write bandwidth, all links", "MiB/sec"},
};

/* The checks every per-device GPM call makes: as the other calls, then Hopper or newer. */
static nvmlReturn_t check_gpm_device(nvmlDevice_t device) {
    nvmlReturn_t rc = check_device(device, F_GPM);
    if (rc != NVML_SUCCESS) return rc;
    return device->gpm_supported ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* On an unsupported GPU (an A100) NVML answers SUCCESS with isSupportedDevice = 0. */
API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    CHECK(device, F_GPM);
    if (!gpmSupport) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    gpmSupport->isSupportedDevice = device->gpm_supported ? 1U : 0U;
    return NVML_SUCCESS;
}

/* Allocation and free do not depend on a device (nvml.h lists INVALID_ARGUMENT and MEMORY). */
API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpm_sample *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    s->magic = GPM_SAMPLE_MAGIC;
    pthread_mutex_lock(&g_gpm_lock);
    s->next = g_gpm_samples;
    g_gpm_samples = s;
    pthread_mutex_unlock(&g_gpm_lock);
    gpmSample->handle = s;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    struct sim_gpm_sample *s = gpmSample.handle, **pp;
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_gpm_lock);
    for (pp = &g_gpm_samples; *pp && *pp != s; pp = &(*pp)->next) {
    }
    int found = *pp != NULL;
    if (found) *pp = s->next;
    pthread_mutex_unlock(&g_gpm_lock);
    if (!found) return NVML_ERROR_INVALID_ARGUMENT;
    s->magic = 0;
    free(s);
    return NVML_SUCCESS;
}

/* A whole GPU's sample includes its MIG instances (weighted); a MIG sample is the instance's own. */
static void take_sample(nvmlDevice_t device, struct sim_gpm_sample *s) {
    double now = now_s();
    for (int c = 0; c < NCH; c++) s->cum[c] = device->is_mig ? own_cum(device, c, now) : whole_cum(device, c, now);
    if (device->is_mig)
        snprintf(s->uuid, sizeof s->uuid, "%.60s/gi%u", device->parent->uuid, device->gi);
    else
        snprintf(s->uuid, sizeof s->uuid, "%s", device->uuid);
    s->t = now;
    s->filled = 1;
}

API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    nvmlReturn_t rc = check_gpm_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (!sample_known(gpmSample.handle)) return NVML_ERROR_INVALID_ARGUMENT;
    take_sample(device, gpmSample.handle);
    return NVML_SUCCESS;
}

/*
 * A sample of one MIG GPU instance, taken on the parent GPU's handle (nvml.h: "device: the
 * parent device", Hopper or newer; an A100 answers NOT_SUPPORTED as for every GPM call). NVML
 * documents no specific code for a GPU not in MIG mode or an unknown instance ("Nonzero
 * NVML_ERROR_? enum on error"); we answer NOT_SUPPORTED for the first and INVALID_ARGUMENT for
 * the second (our reading, not verified on hardware).
 */
API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    nvmlReturn_t rc = check_gpm_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (!sample_known(gpmSample.handle)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int i = 0; i < device->mig_count; i++)
        if (device->mig[i]->gi == gpuInstanceId) {
            take_sample(device->mig[i], gpmSample.handle);
            return NVML_SUCCESS;
        }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/*
 * Pure computation on two samples, like NVML's: faults and init state do not apply (a GPU
 * lost after both samples were taken still yields the metrics between them).
 */
API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    if (!metricsGet) return NVML_ERROR_INVALID_ARGUMENT;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_gpm_sample *s1 = metricsGet->sample1.handle, *s2 = metricsGet->sample2.handle;
    if (!sample_known(s1) || !sample_known(s2) || !s1->filled || !s2->filled) return NVML_ERROR_INVALID_ARGUMENT;
    if (strcmp(s1->uuid, s2->uuid) != 0) return NVML_ERROR_INVALID_ARGUMENT; /* two different GPUs */
    double dt = s2->t - s1->t;
    if (!(dt > 0)) return NVML_ERROR_INVALID_ARGUMENT; /* sample2 must be the later one */
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        for (size_t k = 0; k < sizeof GPM_METRICS / sizeof GPM_METRICS[0]; k++) {
            if (GPM_METRICS[k].id != m->metricId) continue;
            int c = GPM_METRICS[k].channel;
            double v = (s2->cum[c] - s1->cum[c]) / dt;
            /* a SIGKILLed plan ends at its last heartbeat, which may precede a sample taken
               while it still looked alive: keep such rounding inside the metric's range */
            v = CH_PERCENT[c] ? fmin(100.0, fmax(0.0, v)) : fmax(0.0, v);
            m->nvmlReturn = NVML_SUCCESS;
            m->value = v;
            m->metricInfo.shortName = GPM_METRICS[k].short_name;
            m->metricInfo.longName = GPM_METRICS[k].long_name;
            m->metricInfo.unit = GPM_METRICS[k].unit;
            break;
        }
    }
    return NVML_SUCCESS;
}

/* Streaming keeps no counter state here (the simulated counters are exact either way); the
   switch is remembered per GPU for this process, 0 (off) after nvmlInit. */
API nvmlReturn_t nvmlGpmQueryIfStreamingEnabled(nvmlDevice_t device, unsigned int *state) {
    nvmlReturn_t rc = check_gpm_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    *state = device->gpm_streaming;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpmSetStreamingEnabled(nvmlDevice_t device, unsigned int state) {
    nvmlReturn_t rc = check_gpm_device(device);
    if (rc != NVML_SUCCESS) return rc;
    if (state > 1) return NVML_ERROR_INVALID_ARGUMENT;
    device->gpm_streaming = state;
    return NVML_SUCCESS;
}
