/*
 * A fake libnvidia-ml.so.1 for testing without a GPU.
 *
 * It is compiled against NVIDIA's own nvml.h (from the nvidia-nvml-dev wheel), so the compiler
 * checks every signature and struct layout we hand back to the real nvidia-ml-py bindings.
 * What the "driver" reports comes from a scenario file named by $FAKE_NVML_SCENARIO; the format is
 * described in tests/fakenvml/README.md.  The file is re-read whenever it changes, so a test can
 * change what a running process sees.
 *
 * Locking: one mutex guards the parsed state.  Calls that block on real hardware
 * (nvmlDeviceGetPcieThroughput, nvmlEventSetWait_v2, the per-device `delay_ms`) sleep with the
 * mutex released, so callers sampling several GPUs from several threads overlap as they do on a
 * real driver.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvml.h"

#define MAX_GPUS 128
#define MAX_MIG 8
#define MAX_FANS 8
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define NVLINK_ERRORS 14

/* The NVLink error counters per link, by field id and key name: nvml.h's NVML_FI_DEV_NVLINK_ERROR_DL_*
 * (161-163) on NVLink 4 and older, which Blackwell answers NOT_SUPPORTED (issue 36: "On Blackwell the
 * old fields 161-163 are unsupported"), and NVLink 5's NVML_FI_DEV_NVLINK_COUNT_* (206-221), which
 * only Blackwell has.  `nvlink5` says which generation has the counter. */
static const struct {
    unsigned int field;
    const char *name;
    int nvlink5;
} nvlink_errors[NVLINK_ERRORS] = {
    {NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, "replay", 0},
    {NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, "recovery", 0},
    {NVML_FI_DEV_NVLINK_ERROR_DL_CRC, "crc", 0},
    {NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS, "malformed_packet", 1},
    {NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS, "buffer_overrun", 1},
    {NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS, "receive", 1},
    {NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS, "receive_remote", 1},
    {NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS, "receive_general", 1},
    {NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS, "local_link_integrity", 1},
    {NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS, "transmit_discard", 1},
    {NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS, "recovery_successful", 1},
    {NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS, "recovery_failed", 1},
    {NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, "effective", 1},
    {NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, "symbol", 1},
};
/* NVLink-C2C's error counters (nvml.h 13.3: NVML_FI_DEV_C2C_LINK_ERROR_INTR "C2C Link CRC Error
 * Counter", _REPLAY, _REPLAY_B2B "Back to Back Replay"), 231-233 in order, asked device-wide (scope 0)
 * as DCGM's DCGM_FI_DEV_C2C_LINK_ERROR_* (1400-1402) and Datadog's agent (pkg/collector/corechecks/gpu,
 * fields.go) read them. */
static const char *const c2c_errors[] = {"crc", "replay", "replay_b2b"};
#define MAX_EVENT_SETS 64
#define NO_INSTANCE 0xFFFFFFFFu
#define DEFAULT_PCIE_SAMPLE_MS 20
#define DEFAULT_SUPPORTED_EVENTS (nvmlEventTypeXidCriticalError | nvmlEventTypePState | nvmlEventTypeClock)

/* ---------------------------------------------------------------------------------------------
 * Keys of the scenario file.  Each key is one value slot of a device; indexed families (fans,
 * NVLink links, clocks, thresholds, ECC counters) are expanded into consecutive slots.
 */
enum {
    SCOPE_SYS = 1,
    SCOPE_GPU = 2,
    SCOPE_MIG = 4,
    SCOPE_DEV = SCOPE_GPU | SCOPE_MIG,
};

enum key_type { KT_NUM, KT_STR };

/* The GPM metrics the scenario can set, as percentages (nvmlGpmMetricId_t, nvml.h). */
static const struct {
    unsigned int id;
    const char *key;
    const char *unit;
} gpm_metrics[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_util", "%"},
    {NVML_GPM_METRIC_SM_UTIL, "sm_util", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_util", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "any_tensor_util", "%"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_util", "%"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_util", "%"},
    {NVML_GPM_METRIC_DMMA_TENSOR_UTIL, "dmma_tensor_util", "%"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_util", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_util", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_util", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_util", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_util", "%"},
};
#define NGPM ((int)(sizeof gpm_metrics / sizeof gpm_metrics[0]))

enum {
    /* [system] */
    K_DRIVER_VERSION,
    K_NVML_VERSION,
    K_CUDA_VERSION,
    K_INIT_ERROR,
    K_GPM_METRICS_VERSION,
    K_DRIVER_BRANCH,
    K_UNKNOWN_FIELD,
    /* identity */
    K_NAME,
    K_UUID,
    K_SERIAL,
    K_PCI_BUS_ID,
    K_PCI_DEVICE_ID,
    K_PCI_SUBSYSTEM_ID,
    K_MINOR,
    /* utilization and memory */
    K_UTIL_GPU,
    K_UTIL_MEMORY,
    K_ENCODER_UTIL,
    K_ENCODER_PERIOD,
    K_DECODER_UTIL,
    K_DECODER_PERIOD,
    K_MEM_TOTAL,
    K_MEM_USED,
    K_MEM_FREE,
    K_MEM_RESERVED,
    /* thermal, power, clocks */
    K_TEMP_GPU,
    K_TEMP_MEMORY,
    K_TEMP_MEMORY_TYPE,
    K_THRESHOLD0,
    K_FAN_COUNT = K_THRESHOLD0 + NVML_TEMPERATURE_THRESHOLD_COUNT,
    K_FAN0,
    K_POWER_USAGE = K_FAN0 + MAX_FANS,
    K_POWER_LIMIT,
    K_POWER_MGMT_LIMIT,
    K_ENERGY,
    K_CLOCK0,
    K_CLOCK_MAX0 = K_CLOCK0 + NVML_CLOCK_COUNT,
    K_PSTATE = K_CLOCK_MAX0 + NVML_CLOCK_COUNT,
    K_EVENT_REASONS,
    K_VIOLATION0, /* [NVML_FI_DEV_PERF_POLICY_POWER ... _RELIABILITY - 74], nanoseconds */
    K_VIOLATION_LAST = K_VIOLATION0 + 5,
    K_CLOCK_EVENT0, /* [NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN ... _HW_POWER_BRAKE_SLOWDOWN - 269], ns */
    K_CLOCK_EVENT_LAST = K_CLOCK_EVENT0 + 2,
    /* PCIe */
    K_PCIE_TX_KBPS,
    K_PCIE_RX_KBPS,
    K_PCIE_SAMPLE_MS,
    K_PCIE_TX_BYTES,
    K_PCIE_RX_BYTES,
    K_PCIE_GEN,
    K_PCIE_MAX_GEN,
    K_PCIE_WIDTH,
    K_PCIE_MAX_WIDTH,
    K_PCIE_REPLAY,
    K_RECOVERY_ACTION, /* field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): nvmlDeviceGpuRecoveryAction_t */
    /* NVLink-C2C, the GPU's link to its Grace CPU (GH200, GB200): unset enabled = no C2C */
    K_C2C_ENABLED,
    K_C2C_ERR0, /* fields 231-233, in the order of c2c_errors[] */
    K_C2C_ERR_LAST = K_C2C_ERR0 + 2,
    /* nvmlDeviceGetGpuFabricInfoV: unset state = NOT_SUPPORTED (no fabric) */
    K_FABRIC_STATE,
    K_FABRIC_STATUS,
    K_FABRIC_HEALTH_MASK,
    K_FABRIC_HEALTH_SUMMARY,
    K_FABRIC_CLIQUE,
    K_PCIE_COUNTER_BITS,
    /* NVLink */
    K_NVLINK_COUNT,
    K_NVLINK_BEYOND,
    K_NVLINK_STATE0,
    K_NVLINK_TX0 = K_NVLINK_STATE0 + MAX_LINKS,
    K_NVLINK_RX0 = K_NVLINK_TX0 + MAX_LINKS,
    K_NVLINK_ERR0 = K_NVLINK_RX0 + MAX_LINKS, /* [link * NVLINK_ERRORS + kind], kinds in nvlink_errors[] */
    K_ARCH = K_NVLINK_ERR0 + MAX_LINKS * NVLINK_ERRORS, /* nvmlDeviceGetArchitecture; unset: from the name */
    /* errors */
    K_ECC0, /* [errorType * 2 + counterType] */
    K_ROWS_CORRECTABLE = K_ECC0 + 4,
    K_ROWS_UNCORRECTABLE,
    K_ROWS_PENDING,
    K_ROWS_FAILURE,
    /* MIG */
    K_MIG_MODE,
    K_MIG_PENDING,
    K_MIG_MAX_DEVICES,
    K_GPU_INSTANCE_ID,
    K_COMPUTE_INSTANCE_ID,
    K_GI_LOOKUP,        /* what nvmlDeviceGetGpuInstanceById answers instead (an error) */
    K_GI_PROFILE_ID,    /* nvmlGpuInstanceInfo_t.profileId */
    K_GI_PLACEMENT_START,
    K_GI_PLACEMENT_SIZE,
    /* GPM and per-process utilization */
    K_GPM_SUPPORTED,
    K_GPM0,
    K_PROC_UTIL_SAMPLE_MS = K_GPM0 + NGPM,
    /* behaviour */
    K_EVENTS_SUPPORTED,
    K_STATE,
    K_LOST_AFTER,
    K_LOST_UNTIL,
    K_DELAY_MS,
    /* quirks of real drivers (README: "Driver profiles and quirks") */
    K_FIELDS_ACCUMULATE,
    K_EVENTS_WAIT_LOST,
    K_EVENTS_VIA,
    K_GPM_PARENT_IN_MIG,
    K_PROC_UTIL_RACE,
    K_PROCS_COMPUTE,
    K_PROCS_GRAPHICS,
    K_PROCS_MPS,
    K_MIG_HANDLE,
    K_LOOKUP,           /* what nvmlDeviceGetHandleByIndex/ByUUID answer instead for this GPU (an error) */
    NKEYS
};

struct key_def {
    char name[40];
    enum key_type type;
    int scope;
};

static struct key_def keys[NKEYS];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void def_key(int k, enum key_type type, int scope, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(keys[k].name, sizeof keys[k].name, fmt, ap);
    va_end(ap);
    keys[k].type = type;
    keys[k].scope = scope;
}

static const char *const threshold_names[NVML_TEMPERATURE_THRESHOLD_COUNT] = {
    "shutdown", "slowdown", "mem_max", "gpu_max", "acoustic_min", "acoustic_curr", "acoustic_max", "gps_curr",
};
static const char *const clock_names[NVML_CLOCK_COUNT] = {"graphics", "sm", "memory", "video"};
/* nvmlPerfPolicyType_t 0-5, in field-id order (NVML_FI_DEV_PERF_POLICY_POWER = 74 ... _RELIABILITY = 79). */
static const char *const violation_names[] = {"power", "thermal", "sync_boost", "board_limit", "low_utilization",
                                              "reliability"};

/* The clock event reason counters 269-271 (nvml.h "Field values for Clock Throttle Reason Counters"), in id order. */
static const char *const clock_event_names[] = {"sw_thermal", "hw_thermal", "hw_power_brake"};

static void init_keys(void)
{
    def_key(K_DRIVER_VERSION, KT_STR, SCOPE_SYS, "driver_version");
    def_key(K_NVML_VERSION, KT_STR, SCOPE_SYS, "nvml_version");
    def_key(K_CUDA_VERSION, KT_NUM, SCOPE_SYS, "cuda_version");
    def_key(K_INIT_ERROR, KT_NUM, SCOPE_SYS, "init_error");
    def_key(K_GPM_METRICS_VERSION, KT_NUM, SCOPE_SYS, "gpm_metrics_version");
    def_key(K_DRIVER_BRANCH, KT_NUM, SCOPE_SYS, "driver_branch");
    def_key(K_UNKNOWN_FIELD, KT_NUM, SCOPE_SYS, "unknown_field");
    def_key(K_NAME, KT_STR, SCOPE_DEV, "name");
    def_key(K_UUID, KT_STR, SCOPE_DEV, "uuid");
    def_key(K_SERIAL, KT_STR, SCOPE_GPU, "serial");
    def_key(K_PCI_BUS_ID, KT_STR, SCOPE_GPU, "pci.bus_id");
    def_key(K_PCI_DEVICE_ID, KT_NUM, SCOPE_GPU, "pci.device_id");
    def_key(K_PCI_SUBSYSTEM_ID, KT_NUM, SCOPE_GPU, "pci.subsystem_id");
    def_key(K_MINOR, KT_NUM, SCOPE_GPU, "minor_number");
    def_key(K_UTIL_GPU, KT_NUM, SCOPE_DEV, "util.gpu");
    def_key(K_UTIL_MEMORY, KT_NUM, SCOPE_DEV, "util.memory");
    def_key(K_ENCODER_UTIL, KT_NUM, SCOPE_DEV, "encoder.util");
    def_key(K_ENCODER_PERIOD, KT_NUM, SCOPE_DEV, "encoder.period_us");
    def_key(K_DECODER_UTIL, KT_NUM, SCOPE_DEV, "decoder.util");
    def_key(K_DECODER_PERIOD, KT_NUM, SCOPE_DEV, "decoder.period_us");
    def_key(K_MEM_TOTAL, KT_NUM, SCOPE_DEV, "memory.total");
    def_key(K_MEM_USED, KT_NUM, SCOPE_DEV, "memory.used");
    def_key(K_MEM_FREE, KT_NUM, SCOPE_DEV, "memory.free");
    def_key(K_MEM_RESERVED, KT_NUM, SCOPE_DEV, "memory.reserved");
    def_key(K_TEMP_GPU, KT_NUM, SCOPE_GPU, "temperature.gpu");
    def_key(K_TEMP_MEMORY, KT_NUM, SCOPE_GPU, "temperature.memory");
    def_key(K_TEMP_MEMORY_TYPE, KT_NUM, SCOPE_GPU, "temperature.memory_type");
    for (int i = 0; i < NVML_TEMPERATURE_THRESHOLD_COUNT; i++)
        def_key(K_THRESHOLD0 + i, KT_NUM, SCOPE_GPU, "temperature.threshold.%s", threshold_names[i]);
    def_key(K_FAN_COUNT, KT_NUM, SCOPE_GPU, "fan.count");
    for (int i = 0; i < MAX_FANS; i++)
        def_key(K_FAN0 + i, KT_NUM, SCOPE_GPU, "fan.%d", i);
    def_key(K_POWER_USAGE, KT_NUM, SCOPE_GPU, "power.usage_mw");
    def_key(K_POWER_LIMIT, KT_NUM, SCOPE_GPU, "power.limit_mw");
    def_key(K_POWER_MGMT_LIMIT, KT_NUM, SCOPE_GPU, "power.management_limit_mw");
    def_key(K_ENERGY, KT_NUM, SCOPE_GPU, "energy_mj");
    for (int i = 0; i < NVML_CLOCK_COUNT; i++) {
        def_key(K_CLOCK0 + i, KT_NUM, SCOPE_DEV, "clock.%s_mhz", clock_names[i]);
        def_key(K_CLOCK_MAX0 + i, KT_NUM, SCOPE_DEV, "clock.max.%s_mhz", clock_names[i]);
    }
    def_key(K_PSTATE, KT_NUM, SCOPE_GPU, "pstate");
    def_key(K_EVENT_REASONS, KT_NUM, SCOPE_GPU, "clocks_event_reasons");
    for (int i = 0; i <= K_VIOLATION_LAST - K_VIOLATION0; i++)
        def_key(K_VIOLATION0 + i, KT_NUM, SCOPE_GPU, "violation.%s_ns", violation_names[i]);
    for (int i = 0; i <= K_CLOCK_EVENT_LAST - K_CLOCK_EVENT0; i++)
        def_key(K_CLOCK_EVENT0 + i, KT_NUM, SCOPE_GPU, "clock_event.%s_ns", clock_event_names[i]);
    def_key(K_PCIE_TX_KBPS, KT_NUM, SCOPE_GPU, "pcie.tx_kbps");
    def_key(K_PCIE_RX_KBPS, KT_NUM, SCOPE_GPU, "pcie.rx_kbps");
    def_key(K_PCIE_SAMPLE_MS, KT_NUM, SCOPE_GPU, "pcie.sample_ms");
    def_key(K_PCIE_TX_BYTES, KT_NUM, SCOPE_GPU, "pcie.tx_bytes");
    def_key(K_PCIE_RX_BYTES, KT_NUM, SCOPE_GPU, "pcie.rx_bytes");
    def_key(K_PCIE_GEN, KT_NUM, SCOPE_GPU, "pcie.gen");
    def_key(K_PCIE_MAX_GEN, KT_NUM, SCOPE_GPU, "pcie.max_gen");
    def_key(K_PCIE_WIDTH, KT_NUM, SCOPE_GPU, "pcie.width");
    def_key(K_PCIE_MAX_WIDTH, KT_NUM, SCOPE_GPU, "pcie.max_width");
    def_key(K_PCIE_REPLAY, KT_NUM, SCOPE_GPU, "pcie.replay");
    def_key(K_RECOVERY_ACTION, KT_NUM, SCOPE_GPU, "recovery_action");
    def_key(K_ARCH, KT_NUM, SCOPE_GPU, "arch");
    def_key(K_C2C_ENABLED, KT_NUM, SCOPE_GPU, "c2c.enabled");
    for (int i = 0; i <= K_C2C_ERR_LAST - K_C2C_ERR0; i++)
        def_key(K_C2C_ERR0 + i, KT_NUM, SCOPE_GPU, "c2c.errors.%s", c2c_errors[i]);
    def_key(K_FABRIC_STATE, KT_NUM, SCOPE_GPU, "fabric.state");
    def_key(K_FABRIC_STATUS, KT_NUM, SCOPE_GPU, "fabric.status");
    def_key(K_FABRIC_HEALTH_MASK, KT_NUM, SCOPE_GPU, "fabric.health_mask");
    def_key(K_FABRIC_HEALTH_SUMMARY, KT_NUM, SCOPE_GPU, "fabric.health_summary");
    def_key(K_FABRIC_CLIQUE, KT_NUM, SCOPE_GPU, "fabric.clique_id");
    def_key(K_PCIE_COUNTER_BITS, KT_NUM, SCOPE_GPU, "pcie.counter_bits");
    def_key(K_NVLINK_COUNT, KT_NUM, SCOPE_GPU, "nvlink.count");
    def_key(K_NVLINK_BEYOND, KT_NUM, SCOPE_GPU, "nvlink.beyond");
    for (int i = 0; i < MAX_LINKS; i++) {
        def_key(K_NVLINK_STATE0 + i, KT_NUM, SCOPE_GPU, "nvlink.%d.state", i);
        def_key(K_NVLINK_TX0 + i, KT_NUM, SCOPE_GPU, "nvlink.%d.tx_kib", i);
        def_key(K_NVLINK_RX0 + i, KT_NUM, SCOPE_GPU, "nvlink.%d.rx_kib", i);
        for (int e = 0; e < NVLINK_ERRORS; e++)
            def_key(K_NVLINK_ERR0 + i * NVLINK_ERRORS + e, KT_NUM, SCOPE_GPU, "nvlink.%d.errors.%s", i,
                    nvlink_errors[e].name);
    }
    def_key(K_ECC0 + 0, KT_NUM, SCOPE_GPU, "ecc.corrected.volatile");
    def_key(K_ECC0 + 1, KT_NUM, SCOPE_GPU, "ecc.corrected.aggregate");
    def_key(K_ECC0 + 2, KT_NUM, SCOPE_GPU, "ecc.uncorrected.volatile");
    def_key(K_ECC0 + 3, KT_NUM, SCOPE_GPU, "ecc.uncorrected.aggregate");
    def_key(K_ROWS_CORRECTABLE, KT_NUM, SCOPE_GPU, "rows.correctable");
    def_key(K_ROWS_UNCORRECTABLE, KT_NUM, SCOPE_GPU, "rows.uncorrectable");
    def_key(K_ROWS_PENDING, KT_NUM, SCOPE_GPU, "rows.pending");
    def_key(K_ROWS_FAILURE, KT_NUM, SCOPE_GPU, "rows.failure");
    def_key(K_MIG_MODE, KT_NUM, SCOPE_GPU, "mig.mode");
    def_key(K_MIG_PENDING, KT_NUM, SCOPE_GPU, "mig.pending");
    def_key(K_MIG_MAX_DEVICES, KT_NUM, SCOPE_GPU, "mig.max_devices");
    def_key(K_GPU_INSTANCE_ID, KT_NUM, SCOPE_MIG, "gpu_instance_id");
    def_key(K_COMPUTE_INSTANCE_ID, KT_NUM, SCOPE_MIG, "compute_instance_id");
    def_key(K_GI_LOOKUP, KT_NUM, SCOPE_DEV, "gi.lookup");
    def_key(K_GI_PROFILE_ID, KT_NUM, SCOPE_MIG, "gi.profile_id");
    def_key(K_GI_PLACEMENT_START, KT_NUM, SCOPE_MIG, "gi.placement.start");
    def_key(K_GI_PLACEMENT_SIZE, KT_NUM, SCOPE_MIG, "gi.placement.size");
    def_key(K_GPM_SUPPORTED, KT_NUM, SCOPE_GPU, "gpm.supported");
    for (int i = 0; i < NGPM; i++)
        def_key(K_GPM0 + i, KT_NUM, SCOPE_DEV, "gpm.%s", gpm_metrics[i].key);
    def_key(K_PROC_UTIL_SAMPLE_MS, KT_NUM, SCOPE_GPU, "process_util.sample_ms");
    def_key(K_EVENTS_SUPPORTED, KT_NUM, SCOPE_GPU, "events.supported");
    def_key(K_STATE, KT_NUM, SCOPE_GPU, "state");
    def_key(K_LOST_AFTER, KT_NUM, SCOPE_GPU, "lost_after_s");
    def_key(K_LOST_UNTIL, KT_NUM, SCOPE_GPU, "lost_until_s");
    def_key(K_DELAY_MS, KT_NUM, SCOPE_DEV, "delay_ms");
    def_key(K_FIELDS_ACCUMULATE, KT_NUM, SCOPE_GPU, "fields.accumulate");
    def_key(K_EVENTS_WAIT_LOST, KT_NUM, SCOPE_GPU, "events.wait_lost");
    def_key(K_EVENTS_VIA, KT_NUM, SCOPE_GPU, "events.via");
    def_key(K_GPM_PARENT_IN_MIG, KT_NUM, SCOPE_GPU, "gpm.parent_in_mig");
    def_key(K_PROC_UTIL_RACE, KT_NUM, SCOPE_GPU, "process_util.race");
    def_key(K_PROCS_COMPUTE, KT_NUM, SCOPE_DEV, "processes.compute");
    def_key(K_PROCS_GRAPHICS, KT_NUM, SCOPE_DEV, "processes.graphics");
    def_key(K_PROCS_MPS, KT_NUM, SCOPE_DEV, "processes.mps");
    def_key(K_MIG_HANDLE, KT_NUM, SCOPE_MIG, "handle");
    def_key(K_LOOKUP, KT_NUM, SCOPE_GPU, "lookup");
}

/* ---------------------------------------------------------------------------------------------
 * Error names, as written in scenario files ("!NOT_SUPPORTED") and as nvmlErrorString tells them.
 */
struct error_def {
    nvmlReturn_t code;
    const char *name;
    const char *text;
};

static const struct error_def errors[] = {
    {NVML_SUCCESS, "SUCCESS", "Success"},
    {NVML_ERROR_UNINITIALIZED, "UNINITIALIZED", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "NO_PERMISSION", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "NOT_FOUND", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "TIMEOUT", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "IRQ_ISSUE", "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED", "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "IN_USE", "In use by another client"},
    {NVML_ERROR_MEMORY, "MEMORY", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "NO_DATA", "No data"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES", "Insufficient resources"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {NVML_ERROR_NOT_READY, "NOT_READY", "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU_NOT_FOUND", "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "INVALID_STATE", "Invalid state"},
    {NVML_ERROR_UNKNOWN, "UNKNOWN", "Unknown Error"},
};

static int error_by_name(const char *name, nvmlReturn_t *out)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (strcmp(errors[i].name, name) == 0 && errors[i].code != NVML_SUCCESS) {
            *out = errors[i].code;
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Parsed state.
 */
struct slot {
    unsigned char set;   /* the key appeared in the file */
    nvmlReturn_t err;    /* non-zero: the call reading this value fails with it */
    long double base;    /* value at t0 */
    long double rate;    /* change per second, for counters that move on their own */
    double t0;
    char *str;
};

/* Which list a process line is in.  An MPS client is in the MPS list only: the MPS server
 * (nvidia-cuda-mps-server) owns the CUDA context and is what the compute list shows (NVIDIA's MPS
 * guide: "when querying active processes via nvidia-smi (or any NVML-based application)
 * nvidia-cuda-mps-server will appear as the active CUDA process rather than any of the client
 * processes"), and nvmlDeviceGetMPSComputeRunningProcesses lists the clients ("processes with a
 * Multi-Process Service (MPS) compute context", nvml.h).  A scenario lists the server as a compute
 * line of its own; a pid on two lines is in both lists. */
enum proc_kind { PROC_COMPUTE, PROC_GRAPHICS, PROC_MPS };

struct proc {
    unsigned int pid;
    enum proc_kind kind;
    unsigned long long used; /* NVML_VALUE_NOT_AVAILABLE as ULL when "used=-" */
    unsigned int gi, ci;
    char *name;
    nvmlReturn_t name_err;
    unsigned int util[4]; /* sm, mem, enc, dec percent, for nvmlDeviceGetProcessUtilization */
};

struct xid {
    unsigned long long code;
    double after_s;
    unsigned int gi, ci;
    double seen_at; /* monotonic: when its line first appeared in the scenario (load() keeps it) */
};

struct dev {
    int defined;
    struct slot s[NKEYS];
    struct proc *procs;
    int nprocs, capprocs;
    struct xid *xids;
    int nxids, capxids;
    struct dev *mig[MAX_MIG];
    int nmig;
    unsigned long long races_used; /* process_util.race: buffered calls refused so far */
};

/* ---------------------------------------------------------------------------------------------
 * Driver profiles: what a driver branch knows.  A scenario's branch is `driver_branch`, else the
 * major number of `driver_version`.  fi_max and nvlink_max are NVML_FI_MAX and
 * NVML_NVLINK_MAX_LINKS of the nvidia-ml-py release made from that branch's nvml.h: 12.535.77 (197,
 * 18), 12.550.89 (228, 18), 12.570.172 (269, 18; the first with NVML_VALUE_TYPE_UNSIGNED_SHORT) and
 * 13.580.82 (274, 18).  A branch between two takes the older one's; one after 580 takes this
 * header's; one before 535 takes 535's.  fi_max is also which field ids exist: the clock event
 * reason counters (269-271) on 580 and later, not on 570 and older.
 */
struct profile {
    unsigned int branch;
    unsigned int fi_max;         /* a field id at or above it is unknown to the driver */
    unsigned int nvlink_max;     /* NvLink link indices the driver accepts at all */
    unsigned int fabric_version; /* the newest nvmlGpuFabricInfo_v<N>_t it takes (0: none) */
    unsigned int c2c_errors;     /* whether it defines the C2C error counters, 231-233 */
    unsigned int v3_record;      /* bytes per entry the Get*RunningProcesses_v3 calls write */
};

/* v3_record: R535 changed what the _v3 process calls write, under the same name, from nvmlProcessInfo_v2_t
 * (24 bytes) to an nvmlProcessInfo_t with usedGpuCcProtectedMemory appended (32 bytes): nvml.h of 535.43.02
 * (NVIDIA/nvidia-settings 39c3e28); 535.98 dropped the _v3 calls, 535.104.05 brought them back with the
 * 32-byte struct (nvidia-settings 0cb3bef, 74cae7f; nvitop #88, #89).  R550 went back to 24 bytes and moved
 * the protected memory to nvmlDeviceGetRunningProcessDetailList's nvmlProcessDetail_v1_t, the layout of this
 * header (and nvidia-ml-py 12.550.52's c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t).  The 535 profile is
 * 535.183.01, after 535.104: 32 bytes; the layout of 535.98 (no _v3) is a `hide` of the _v3 symbols. */

/* fabric_version: nvmlGpuFabricInfo_v2_t (the health mask) is in nvidia-ml-py 12.550's bindings,
 * v3_t (the health summary) first in 13.580.65's; a driver refuses a newer struct with
 * ARGUMENT_VERSION_MISMATCH, as it refuses nvmlMemory_v2 with a wrong version. */
/* c2c_errors: 231-234 are a gap in the nvml.h of CUDA 12.8 (nvidia-nvml-dev-cu12 12.8.90, driver 570:
 * 230, then 235) and in nvidia-ml-py 12.570.172; CUDA 12.9's and 12.575.51's define them.  575 itself
 * is modelled by 570's profile, so a 575 scenario answers them as 570 does (unknown). */
static const struct profile profiles[] = {
    {535, 197, 18, 0, 0, 32},
    {550, 228, 18, 2, 0, 24},
    {570, 269, 18, 2, 0, 24},
    {580, 274, 18, 3, 1, 24},
    {UINT_MAX, NVML_FI_MAX, NVML_NVLINK_MAX_LINKS, 3, 1, 24},
};

/* Entry points a branch does not have yet, by the first branch whose nvidia-ml-py binds them; a
 * driver without one answers NVML_ERROR_FUNCTION_NOT_FOUND, which is what nvidia-ml-py raises
 * when the symbol is missing (tests that need the symbol itself gone use build.py's `hide`). */
static const struct {
    const char *fn;
    unsigned int since;
} introduced[] = {
    {"nvmlDeviceGetTemperatureV", 570}, /* first bound by nvidia-ml-py 12.570 */
    {"nvmlDeviceGetGpuFabricInfoV", 550}, /* first bound by nvidia-ml-py 12.550 */
    /* Confidential computing came with R535 (nvml.h of 535.43.02; nvidia-ml-py 12.535.77 binds it), the
     * versioned process list with R550 (12.550's bindings; not in 12.535.77): together they tell a _v3
     * that writes 32 bytes (the one without the other) from one that writes 24, as nvitop reads them. */
    {"nvmlDeviceGetConfComputeMemSizeInfo", 535},
    {"nvmlDeviceGetRunningProcessDetailList", 550},
    /* In nvml.h since CUDA 11.4 (R470) and 11.6 (R510), per NVIDIA's go-nvml copies of each header:
     * every modelled branch has them, so only a branch below 535 given its own profile would not. */
    {"nvmlDeviceGetMPSComputeRunningProcesses", 470},
    {"nvmlDeviceGetMPSComputeRunningProcesses_v2", 470},
    {"nvmlDeviceGetMPSComputeRunningProcesses_v3", 510},
};

struct state {
    struct dev sys;
    struct dev *gpu[MAX_GPUS];
    int ngpus;
    const struct profile *profile;
};

/* Handles are the addresses of these fixed structs, so they stay valid across reloads. */
struct nvmlDevice_st {
    int gpu;
    int mig; /* -1 for a whole GPU */
};

struct nvmlEventSet_st {
    int used;
    unsigned long long mask[MAX_GPUS];
    int delivered[MAX_GPUS];
    double registered_at[MAX_GPUS]; /* monotonic; 0: the GPU is not registered in this set */
};

/* When a GPU was first registered for events in this process (0: never), for this scenario. */
static double first_registered_at[MAX_GPUS];

/* A GPU instance, by its GPU and the first [gpu N mig M] section that carries its id. */
struct nvmlGpuInstance_st {
    int gpu;
    int mig;
};

static struct nvmlDevice_st gpu_handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG];
static struct nvmlGpuInstance_st gi_handles[MAX_GPUS][MAX_MIG];
static struct nvmlEventSet_st event_sets[MAX_EVENT_SETS];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_refcount;
static struct state *cur;
static char *scenario_path;
static char *loaded_text;      /* the text `cur` was parsed from */
static char *rejected_text;    /* the last text that failed to parse, reported once */
static struct stat loaded_stat;
static double epoch;           /* monotonic time of the first load of this scenario path */

/* Driver time a test moved on with fakeNvmlAdvanceClock, in microseconds.  It is added to every
 * clock the fake reads for driver time (counters, event and loss delays, GPM and utilization
 * samples, field timestamps), never to its real sleeps (a PCIe sample, `delay_ms`), so an
 * in-process test moves a counter on by seconds without waiting for them. */
static long long clock_offset_us;

static double clock_offset_s(void)
{
    return (double)__atomic_load_n(&clock_offset_us, __ATOMIC_SEQ_CST) / 1e6;
}

/* Not part of NVML: move the driver's clocks on by `seconds` (see clock_offset_us). */
void DECLDIR fakeNvmlAdvanceClock(double seconds);
void DECLDIR fakeNvmlAdvanceClock(double seconds)
{
    if (seconds > 0)
        __atomic_add_fetch(&clock_offset_us, (long long)(seconds * 1e6), __ATOMIC_SEQ_CST);
}

/* Not part of NVML: the driver's clocks as the exporter should see them, in seconds: the monotonic
 * clock (CLOCK_MONOTONIC, what Python's time.monotonic reads) and the wall clock of its timestamps,
 * each moved on like the fake's own. */
double DECLDIR fakeNvmlMonotonic(void);
double DECLDIR fakeNvmlWallClock(void);

/* A step of the system's wall clock (NTP stepping it, an admin's `date -s`), in microseconds: it
 * moves the timestamps the driver stamps with CPU time (field values, per-process utilization
 * samples: nvml.h "CPU Timestamp in microseconds"), never the monotonic clock that counters and
 * samples accrue on, so a step back by an hour leaves the work done per second as it was. */
static long long wall_step_us;

/* Not part of NVML: step the wall clock by `seconds`, back where negative (see wall_step_us). */
void DECLDIR fakeNvmlStepWallClock(double seconds);
void DECLDIR fakeNvmlStepWallClock(double seconds)
{
    __atomic_add_fetch(&wall_step_us, (long long)(seconds * 1e6), __ATOMIC_SEQ_CST);
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + clock_offset_s();
}

/* The wall clock of the driver's timestamps, in microseconds (moved on like mono_now, and stepped). */
static long long wall_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 + __atomic_load_n(&clock_offset_us, __ATOMIC_SEQ_CST) +
           __atomic_load_n(&wall_step_us, __ATOMIC_SEQ_CST);
}

double DECLDIR fakeNvmlMonotonic(void)
{
    return mono_now();
}

double DECLDIR fakeNvmlWallClock(void)
{
    return (double)wall_now_us() / 1e6;
}

static void sleep_ms(double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static void free_dev(struct dev *d)
{
    if (!d)
        return;
    for (int k = 0; k < NKEYS; k++)
        free(d->s[k].str);
    for (int i = 0; i < d->nprocs; i++)
        free(d->procs[i].name);
    free(d->procs);
    free(d->xids);
    for (int i = 0; i < MAX_MIG; i++) {
        free_dev(d->mig[i]);
        free(d->mig[i]);
    }
}

static void free_state(struct state *st)
{
    if (!st)
        return;
    free_dev(&st->sys);
    for (int i = 0; i < MAX_GPUS; i++) {
        free_dev(st->gpu[i]);
        free(st->gpu[i]);
    }
    free(st);
}

/* ---------------------------------------------------------------------------------------------
 * Parser.  Errors name the file and line; the caller decides whether they fail nvmlInit (first
 * load) or are reported and ignored (a reload of a file that is being rewritten).
 */
struct parser {
    const char *path;
    int line;
    char msg[512];
};

static int perr(struct parser *p, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(p->msg, sizeof p->msg, "%s:%d: ", p->path, p->line);
    va_start(ap, fmt);
    vsnprintf(p->msg + n, sizeof p->msg - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* A number: decimal, 0x-hex or a float with exponent, all read exactly up to 2^64. */
static int parse_number(const char *s, long double *out, const char **end)
{
    char *e;
    errno = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        unsigned long long v = strtoull(s, &e, 16);
        if (e == s + 2 || errno)
            return -1;
        *out = (long double)v;
    } else {
        long double v = strtold(s, &e);
        if (e == s || errno)
            return -1;
        *out = v;
    }
    *end = e;
    return 0;
}

static int parse_value(struct parser *p, int k, const char *v, struct slot *sl, double now)
{
    sl->set = 1;
    sl->t0 = now;
    if (v[0] == '!') {
        if (!error_by_name(v + 1, &sl->err))
            return perr(p, "unknown NVML error '%s' for key '%s' (use e.g. !NOT_SUPPORTED, !GPU_IS_LOST, "
                           "!NO_PERMISSION, !UNKNOWN, !TIMEOUT)", v + 1, keys[k].name);
        return 0;
    }
    if (keys[k].type == KT_STR) {
        if (!*v)
            return perr(p, "empty value for key '%s'", keys[k].name);
        sl->str = strdup(v);
        return 0;
    }
    if (k == K_INIT_ERROR) {
        if (!error_by_name(v, &sl->err))
            return perr(p, "unknown NVML error '%s' for init_error (e.g. DRIVER_NOT_LOADED, NO_PERMISSION)", v);
        return 0;
    }
    if (k == K_STATE) {
        if (strcmp(v, "ok") == 0)
            sl->base = 0;
        else if (strcmp(v, "lost") == 0)
            sl->base = 1;
        else if (strcmp(v, "reset_required") == 0)
            sl->base = 2;
        else
            return perr(p, "state must be 'ok', 'lost' or 'reset_required', not '%s'", v);
        return 0;
    }
    const char *e;
    if (k >= K_GPM0 && k < K_GPM0 + NGPM) {
        if (parse_number(v, &sl->rate, &e) < 0 || *e)
            return perr(p, "key '%s' needs a percentage or !ERROR; got '%s'", keys[k].name, v);
        if (sl->rate < 0)
            return perr(p, "key '%s' is a percentage and cannot be negative; got '%s'", keys[k].name, v);
        sl->base = 0; /* percent-seconds accumulated since the line was loaded */
        return 0;
    }
    if (parse_number(v, &sl->base, &e) < 0)
        return perr(p, "key '%s' needs a number, !ERROR, or 'N +R/s'; got '%s'", keys[k].name, v);
    while (isspace((unsigned char)*e))
        e++;
    if (*e == '+' || *e == '-') {
        const char *r = e + 1;
        const char *re;
        if (parse_number(r, &sl->rate, &re) < 0 || strcmp(re, "/s") != 0)
            return perr(p, "bad rate in '%s' for key '%s' (write e.g. '1000 +250/s')", v, keys[k].name);
        if (*e == '-')
            sl->rate = -sl->rate;
    } else if (*e) {
        return perr(p, "trailing text '%s' after the number for key '%s'", e, keys[k].name);
    }
    return 0;
}

static int find_key(const char *name)
{
    for (int k = 0; k < NKEYS; k++)
        if (strcmp(keys[k].name, name) == 0)
            return k;
    return -1;
}

/* "name=value" words of process and xid lines. */
static int word_uint(struct parser *p, const char *what, const char *val, unsigned long long *out)
{
    char *e;
    errno = 0;
    unsigned long long v = strtoull(val, &e, 0);
    if (e == val || *e || errno || val[0] == '-')
        return perr(p, "%s needs a non-negative integer, got '%s'", what, val);
    *out = v;
    return 0;
}

static int parse_process(struct parser *p, struct dev *d, char *v)
{
    struct proc pr;
    memset(&pr, 0, sizeof pr);
    pr.gi = pr.ci = NO_INSTANCE;
    int have_pid = 0, have_used = 0;
    char *save = NULL;
    char *w = strtok_r(v, " \t", &save);
    if (!w || (strcmp(w, "compute") != 0 && strcmp(w, "graphics") != 0 && strcmp(w, "mps") != 0))
        return perr(p, "process line must start with 'compute' or 'graphics' ('mps' for an MPS client): "
                       "process = compute pid=1234 used=1073741824 [name=python3] [gi=1 ci=0]");
    pr.kind = w[0] == 'g' ? PROC_GRAPHICS : w[0] == 'm' ? PROC_MPS : PROC_COMPUTE;
    while ((w = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(w, '=');
        if (!eq)
            return perr(p, "process: expected name=value, got '%s'", w);
        *eq = '\0';
        const char *val = eq + 1;
        unsigned long long n;
        if (strcmp(w, "pid") == 0) {
            if (word_uint(p, "process pid", val, &n) < 0)
                return -1;
            if (n == 0 || n > UINT_MAX)
                return perr(p, "process pid %llu is out of range", n);
            pr.pid = (unsigned int)n;
            have_pid = 1;
        } else if (strcmp(w, "used") == 0) {
            if (strcmp(val, "-") == 0) {
                pr.used = (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
            } else {
                if (word_uint(p, "process used", val, &n) < 0)
                    return -1;
                pr.used = n;
            }
            have_used = 1;
        } else if (strcmp(w, "name") == 0) {
            if (val[0] == '!') {
                if (!error_by_name(val + 1, &pr.name_err))
                    return perr(p, "process: unknown NVML error '%s'", val + 1);
            } else {
                free(pr.name);
                pr.name = strdup(val);
            }
        } else if (strcmp(w, "gi") == 0 || strcmp(w, "ci") == 0) {
            if (word_uint(p, w, val, &n) < 0)
                return -1;
            if (w[0] == 'g')
                pr.gi = (unsigned int)n;
            else
                pr.ci = (unsigned int)n;
        } else if (strcmp(w, "sm") == 0 || strcmp(w, "mem") == 0 || strcmp(w, "enc") == 0 ||
                   strcmp(w, "dec") == 0) {
            /* Any unsigned value is accepted, so tests can feed the exporter out-of-range ones. */
            if (word_uint(p, w, val, &n) < 0 || n > UINT_MAX) {
                free(pr.name);
                return perr(p, "process %s= needs a percentage, got '%s'", w, val);
            }
            pr.util[w[0] == 's' ? 0 : w[0] == 'm' ? 1 : w[0] == 'e' ? 2 : 3] = (unsigned int)n;
        } else {
            free(pr.name);
            return perr(p, "process: unknown word '%s' (known: pid, used, name, gi, ci, sm, mem, enc, dec)", w);
        }
    }
    if (!have_pid || !have_used) {
        free(pr.name);
        return perr(p, "process line needs pid= and used=");
    }
    if (d->nprocs == d->capprocs) {
        d->capprocs = d->capprocs ? d->capprocs * 2 : 8;
        d->procs = realloc(d->procs, (size_t)d->capprocs * sizeof *d->procs);
    }
    d->procs[d->nprocs++] = pr;
    return 0;
}

static int parse_xid(struct parser *p, struct dev *d, char *v)
{
    struct xid x = {0, 0, NO_INSTANCE, NO_INSTANCE, 0};
    char *save = NULL;
    char *w = strtok_r(v, " \t", &save);
    unsigned long long n;
    if (!w || word_uint(p, "xid", w, &x.code) < 0)
        return perr(p, "xid line: xid = CODE [after=SECONDS] [gi=N ci=N]");
    while ((w = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(w, '=');
        if (!eq)
            return perr(p, "xid: expected name=value, got '%s'", w);
        *eq = '\0';
        const char *val = eq + 1;
        if (strcmp(w, "after") == 0) {
            char *e;
            x.after_s = strtod(val, &e);
            if (e == val || *e || x.after_s < 0)
                return perr(p, "xid after= needs seconds, got '%s'", val);
        } else if (strcmp(w, "gi") == 0 || strcmp(w, "ci") == 0) {
            if (word_uint(p, w, val, &n) < 0)
                return -1;
            if (w[0] == 'g')
                x.gi = (unsigned int)n;
            else
                x.ci = (unsigned int)n;
        } else {
            return perr(p, "xid: unknown word '%s' (known: after, gi, ci)", w);
        }
    }
    if (d->nxids == d->capxids) {
        d->capxids = d->capxids ? d->capxids * 2 : 8;
        d->xids = realloc(d->xids, (size_t)d->capxids * sizeof *d->xids);
    }
    d->xids[d->nxids++] = x;
    return 0;
}

static int parse_section(struct parser *p, struct state *st, char *hdr, struct dev **out, int *scope)
{
    int a, b, n = 0;
    char extra;
    if (strcmp(hdr, "system") == 0) {
        *out = &st->sys;
        *scope = SCOPE_SYS;
        return 0;
    }
    if (sscanf(hdr, "gpu %d mig %d %c", &a, &b, &extra) == 2) {
        if (a < 0 || a >= MAX_GPUS || b < 0 || b >= MAX_MIG)
            return perr(p, "[gpu %d mig %d]: gpu must be 0..%d and mig 0..%d", a, b, MAX_GPUS - 1, MAX_MIG - 1);
        if (!st->gpu[a])
            return perr(p, "[gpu %d mig %d] comes before its [gpu %d] section", a, b, a);
        if (st->gpu[a]->mig[b])
            return perr(p, "duplicate section [gpu %d mig %d]", a, b);
        if (b != st->gpu[a]->nmig)
            return perr(p, "MIG devices of gpu %d must be numbered 0, 1, 2... in order; expected mig %d",
                        a, st->gpu[a]->nmig);
        st->gpu[a]->mig[b] = calloc(1, sizeof(struct dev));
        st->gpu[a]->mig[b]->defined = 1;
        st->gpu[a]->nmig++;
        *out = st->gpu[a]->mig[b];
        *scope = SCOPE_MIG;
        return 0;
    }
    if (sscanf(hdr, "gpu %d%n", &a, &n) == 1 && hdr[n] == '\0') {
        if (a < 0 || a >= MAX_GPUS)
            return perr(p, "[gpu %d]: index must be 0..%d", a, MAX_GPUS - 1);
        if (st->gpu[a])
            return perr(p, "duplicate section [gpu %d]", a);
        if (a != st->ngpus)
            return perr(p, "GPUs must be numbered 0, 1, 2... in order; expected [gpu %d]", st->ngpus);
        st->gpu[a] = calloc(1, sizeof(struct dev));
        st->gpu[a]->defined = 1;
        st->ngpus++;
        *out = st->gpu[a];
        *scope = SCOPE_GPU;
        return 0;
    }
    return perr(p, "unknown section [%s] (known: [system], [gpu N], [gpu N mig M])", hdr);
}

static struct state *parse(const char *path, char *text, char *msg, size_t msglen, double now)
{
    struct parser p = {path, 0, ""};
    struct state *st = calloc(1, sizeof *st);
    struct dev *d = NULL;
    int scope = 0, ended = 0;
    /* strtok_r would merge empty lines and lose line numbers; split by hand. */
    char *line = text;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        p.line++;
        char *s = trim(line);
        line = nl ? nl + 1 : NULL;
        if (!*s || *s == '#')
            continue;
        if (ended) {
            perr(&p, "text after the 'end' line");
            goto fail;
        }
        if (strcmp(s, "end") == 0) {
            ended = 1;
            continue;
        }
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (!close || trim(close + 1)[0]) {
                perr(&p, "malformed section header '%s'", s);
                goto fail;
            }
            *close = '\0';
            if (parse_section(&p, st, trim(s + 1), &d, &scope) < 0)
                goto fail;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            perr(&p, "expected 'key = value', got '%s'", s);
            goto fail;
        }
        *eq = '\0';
        char *k = trim(s), *v = trim(eq + 1);
        if (!d) {
            perr(&p, "'%s' is outside any section; start with [system] or [gpu 0]", k);
            goto fail;
        }
        if (strcmp(k, "process") == 0 && scope != SCOPE_SYS) {
            if (scope == SCOPE_MIG) {
                perr(&p, "list processes of MIG devices under their [gpu N] with gi= and ci=");
                goto fail;
            }
            if (parse_process(&p, d, v) < 0)
                goto fail;
            continue;
        }
        if (strcmp(k, "xid") == 0 && scope == SCOPE_GPU) {
            if (parse_xid(&p, d, v) < 0)
                goto fail;
            continue;
        }
        int key = find_key(k);
        if (key < 0) {
            perr(&p, "unknown key '%s'", k);
            goto fail;
        }
        if (!(keys[key].scope & scope)) {
            perr(&p, "key '%s' does not belong in this section", k);
            goto fail;
        }
        if (d->s[key].set) {
            perr(&p, "key '%s' is set twice in this section", k);
            goto fail;
        }
        if (parse_value(&p, key, v, &d->s[key], now) < 0)
            goto fail;
    }
    if (!ended) {
        p.line++;
        perr(&p, "missing the final 'end' line (is the file complete?)");
        goto fail;
    }
    return st;
fail:
    snprintf(msg, msglen, "%s", p.msg);
    free_state(st);
    return NULL;
}

static long double slot_value(const struct slot *s, double now)
{
    long double v = s->base + s->rate * (long double)(now - s->t0);
    return v < 0 ? 0 : v;
}

/* Counters keep counting across a reload: an unchanged line keeps its clock, a line whose rate
 * alone changed continues from where the old rate had brought it, and a changed base is a reset. */
static void carry_counters(struct dev *nd, const struct dev *od, double now)
{
    if (!nd || !od)
        return;
    for (int k = 0; k < NKEYS; k++) {
        struct slot *n = &nd->s[k];
        const struct slot *o = &od->s[k];
        if (keys[k].type != KT_NUM || !n->set || !o->set || n->err || o->err)
            continue;
        if (k >= K_GPM0 && k < K_GPM0 + NGPM) {
            /* A GPM percentage is the rate of an integral that never resets: carry what it has
             * accumulated, whatever the new percentage. */
            n->base = slot_value(o, now);
            n->t0 = now;
            continue;
        }
        if (n->base != o->base)
            continue;
        if (n->rate == o->rate) {
            n->t0 = o->t0;
        } else {
            n->base = slot_value(o, now);
            n->t0 = now;
        }
    }
    for (int m = 0; m < MAX_MIG; m++)
        carry_counters(nd->mig[m], od->mig[m], now);
}

/* A real card's byte counters move at the rate its throughput sample reports: where a scenario
 * gives pcie.tx_kbps / rx_kbps but no pcie.tx_bytes / rx_bytes, the counters are derived from it
 * (KB = 1024 bytes, as the exporter reads it), and carried across reloads like any counter. */
static void derive_pcie_counters(struct dev *d, double now)
{
    static const int pairs[2][2] = {{K_PCIE_TX_KBPS, K_PCIE_TX_BYTES}, {K_PCIE_RX_KBPS, K_PCIE_RX_BYTES}};
    if (!d)
        return;
    for (int i = 0; i < 2; i++) {
        const struct slot *kbps = &d->s[pairs[i][0]];
        struct slot *bytes = &d->s[pairs[i][1]];
        if (bytes->set || !kbps->set || kbps->err)
            continue;
        bytes->set = 1;
        bytes->base = 0;
        bytes->rate = slot_value(kbps, now) * 1024.0L;
        bytes->t0 = now;
    }
}

static const struct profile *profile_of(const struct state *st)
{
    unsigned int branch = 0;
    const struct slot *b = &st->sys.s[K_DRIVER_BRANCH], *v = &st->sys.s[K_DRIVER_VERSION];
    if (b->set && !b->err)
        branch = (unsigned int)b->base;
    else if (v->set && !v->err && v->str)
        branch = (unsigned int)strtoul(v->str, NULL, 10);
    if (branch == 0)
        branch = profiles[sizeof profiles / sizeof profiles[0] - 2].branch; /* the newest modelled */
    const struct profile *p = &profiles[0];
    for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++)
        if (profiles[i].branch <= branch)
            p = &profiles[i];
    if (p->branch == 580 && branch > 580)
        p = &profiles[sizeof profiles / sizeof profiles[0] - 1];
    return p;
}

static char *read_file(const char *path, struct stat *st)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fstat(fileno(f), st) < 0) {
        fclose(f);
        return NULL;
    }
    size_t cap = (size_t)st->st_size + 1, len = 0;
    char *buf = malloc(cap + 1);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

static int same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Called with the lock held.  Returns 0, or -1 with msg filled when the file cannot be used. */
static int load(int first, char *msg, size_t msglen)
{
    struct stat sb;
    if (!first) {
        if (stat(scenario_path, &sb) < 0)
            return 0; /* between unlink and rename: keep what we have */
        /* A rewrite in place can land within one mtime tick of the previous one; while the file
         * is that fresh, compare contents rather than trusting the timestamps. */
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        int fresh = rt.tv_sec - sb.st_mtim.tv_sec < 2;
        if (same_stat(&sb, &loaded_stat) && !fresh)
            return 0;
    }
    char *text = read_file(scenario_path, &sb);
    if (!text) {
        if (first) {
            snprintf(msg, msglen, "%s: cannot read the scenario file: %s", scenario_path, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (!first && loaded_text && strcmp(text, loaded_text) == 0) {
        loaded_stat = sb;
        free(text);
        return 0;
    }
    if (!first && rejected_text && strcmp(text, rejected_text) == 0) {
        free(text);
        return 0;
    }
    char *copy = strdup(text);
    double now = mono_now();
    struct state *st = parse(scenario_path, copy, msg, msglen, now);
    free(copy);
    if (!st) {
        if (!first) {
            /* Usually a file caught half-written; the previous state stays in force. */
            fprintf(stderr, "fake NVML: ignoring the changed scenario: %s\n", msg);
            free(rejected_text);
            rejected_text = text;
        } else {
            free(text);
        }
        return -1;
    }
    for (int i = 0; i < MAX_GPUS; i++)
        derive_pcie_counters(st->gpu[i], now);
    /* An XID line already there keeps the time it appeared; a line added by this change appears now
     * (see next_event). */
    for (int i = 0; i < MAX_GPUS; i++) {
        struct dev *d = st->gpu[i], *old = cur ? cur->gpu[i] : NULL;
        for (int x = 0; d && x < d->nxids; x++)
            d->xids[x].seen_at = old && x < old->nxids ? old->xids[x].seen_at : now;
    }
    st->profile = profile_of(st);
    if (cur) {
        for (int i = 0; i < MAX_GPUS; i++)
            carry_counters(st->gpu[i], cur->gpu[i], now);
        carry_counters(&st->sys, &cur->sys, now);
    }
    free_state(cur);
    cur = st;
    free(loaded_text);
    loaded_text = text;
    loaded_stat = sb;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Entry helpers.
 */
static nvmlReturn_t driver_error(void)
{
    const struct slot *s = &cur->sys.s[K_INIT_ERROR];
    return s->set ? s->err : NVML_SUCCESS;
}

/* Calls made, by entry point: what a test reads to prove a query was (or was not) made.  Names
 * are the functions' __func__, so pointers compare; a name is counted under the lock. */
#define MAX_COUNTED 256
static struct {
    const char *fn;
    unsigned long long n;
} counted[MAX_COUNTED];
static int ncounted;

static void count_call(const char *fn)
{
    for (int i = 0; i < ncounted; i++)
        if (counted[i].fn == fn) {
            counted[i].n++;
            return;
        }
    if (ncounted < MAX_COUNTED) {
        counted[ncounted].fn = fn;
        counted[ncounted++].n = 1;
    }
}

/* Not part of NVML: how many calls were made to entry points whose name starts with `prefix`
 * ("nvmlDeviceGetNvLinkState", or "nvmlDeviceGetComputeRunningProcesses" for every version). */
unsigned long long DECLDIR fakeNvmlCallCount(const char *prefix)
{
    unsigned long long n = 0;
    size_t len = prefix ? strlen(prefix) : 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < ncounted; i++)
        if (strncmp(counted[i].fn, prefix ? prefix : "", len) == 0)
            n += counted[i].n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* NVML_ERROR_FUNCTION_NOT_FOUND where the scenario's driver branch predates `fn`. */
static nvmlReturn_t function_missing(const char *fn)
{
    for (size_t i = 0; i < sizeof introduced / sizeof introduced[0]; i++)
        if (strcmp(introduced[i].fn, fn) == 0 && cur->profile->branch < introduced[i].since)
            return NVML_ERROR_FUNCTION_NOT_FOUND;
    return NVML_SUCCESS;
}

/* Lock, count the call (fn NULL: a re-entry, not counted), reload if the file changed, and check
 * that the library is initialised. */
static nvmlReturn_t enter_counted(const char *fn)
{
    char msg[512];
    pthread_mutex_lock(&lock);
    if (fn)
        count_call(fn);
    if (init_refcount == 0) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    load(0, msg, sizeof msg);
    nvmlReturn_t r = driver_error();
    if (!r && fn)
        r = function_missing(fn);
    if (r) {
        pthread_mutex_unlock(&lock);
        return r;
    }
    return NVML_SUCCESS;
}
#define enter() enter_counted(__func__)

static nvmlReturn_t leave(nvmlReturn_t r)
{
    pthread_mutex_unlock(&lock);
    return r;
}

static int valid_handle(nvmlDevice_t h)
{
    if ((h >= &gpu_handles[0] && h < &gpu_handles[MAX_GPUS]))
        return ((char *)h - (char *)gpu_handles) % sizeof *h == 0;
    if (h >= &mig_handles[0][0] && h < &mig_handles[0][0] + MAX_GPUS * MAX_MIG)
        return ((char *)h - (char *)mig_handles) % sizeof *h == 0;
    return 0;
}

static int gpu_lost(const struct dev *g, double now)
{
    const struct slot *st = &g->s[K_STATE];
    if (st->set && st->base == 1)
        return 1;
    const struct slot *a = &g->s[K_LOST_AFTER], *u = &g->s[K_LOST_UNTIL];
    double since = now - epoch;
    if (a->set && !a->err && since >= (double)a->base)
        return !(u->set && !u->err && since >= (double)u->base);
    return 0;
}

/* The device behind a handle in the current state, or an error.  Called with the lock held. */
static nvmlReturn_t resolve(nvmlDevice_t h, struct dev **out, struct dev **gpu_out)
{
    if (!valid_handle(h))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (h->gpu >= cur->ngpus)
        return NVML_ERROR_GPU_IS_LOST;
    struct dev *g = cur->gpu[h->gpu];
    if (gpu_lost(g, mono_now()))
        return NVML_ERROR_GPU_IS_LOST;
    struct dev *d = g;
    if (h->mig >= 0) {
        if (h->mig >= g->nmig)
            return NVML_ERROR_INVALID_ARGUMENT;
        d = g->mig[h->mig];
    }
    *out = d;
    if (gpu_out)
        *gpu_out = g;
    return NVML_SUCCESS;
}

/* A GPU in state reset_required (nvml.h: NVML_ERROR_RESET_REQUIRED, "The GPU requires a reset before
 * it can be used again") still says who it is: the driver keeps its identity from the probe, as
 * nvidia-smi lists such a GPU by name and bus id (leptonai/gpud #1133: utilization answered "GPU
 * requires reset").  Every other device query answers RESET_REQUIRED. */
static int answers_while_reset_required(const char *fn)
{
    static const char *const identity[] = {"nvmlDeviceGetIndex", "device_str", "nvmlDeviceGetPciInfo_v3",
                                           "nvmlDeviceGetMinorNumber"};
    for (size_t i = 0; fn && i < sizeof identity / sizeof *identity; i++)
        if (strcmp(fn, identity[i]) == 0)
            return 1;
    return 0;
}

static int reset_required(const struct dev *g)
{
    const struct slot *st = &g->s[K_STATE];
    return st->set && st->base == 2;
}

/* enter() plus handle resolution and the device's injected latency.  On success the lock is held. */
static nvmlReturn_t enter_dev_counted(nvmlDevice_t h, struct dev **out, const char *fn)
{
    nvmlReturn_t r = enter_counted(fn);
    if (r)
        return r;
    struct dev *g = NULL;
    r = resolve(h, out, &g);
    if (r)
        return leave(r);
    if (reset_required(g) && !answers_while_reset_required(fn))
        return leave(NVML_ERROR_RESET_REQUIRED);
    const struct slot *delay = &(*out)->s[K_DELAY_MS];
    if (delay->set && !delay->err && delay->base > 0) {
        double ms = (double)delay->base;
        pthread_mutex_unlock(&lock);
        sleep_ms(ms);
        if ((r = enter_counted(NULL)))
            return r;
        if ((r = resolve(h, out, NULL)))
            return leave(r);
    }
    return NVML_SUCCESS;
}
#define enter_dev(h, out) enter_dev_counted((h), (out), __func__)


static nvmlReturn_t get_num(const struct dev *d, int k, long double *v)
{
    const struct slot *s = &d->s[k];
    if (!s->set)
        return NVML_ERROR_NOT_SUPPORTED;
    if (s->err)
        return s->err;
    *v = slot_value(s, mono_now());
    return NVML_SUCCESS;
}

static nvmlReturn_t get_uint(const struct dev *d, int k, unsigned int *out)
{
    long double v;
    nvmlReturn_t r = get_num(d, k, &v);
    if (r)
        return r;
    *out = v > (long double)UINT_MAX ? UINT_MAX : (unsigned int)v;
    return NVML_SUCCESS;
}

static nvmlReturn_t get_ull(const struct dev *d, int k, unsigned long long *out)
{
    long double v;
    nvmlReturn_t r = get_num(d, k, &v);
    if (r)
        return r;
    *out = v >= 18446744073709551615.0L ? ULLONG_MAX : (unsigned long long)v;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_str(const char *s, char *buf, unsigned int len)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t get_str(const struct dev *d, int k, char *buf, unsigned int len)
{
    const struct slot *s = &d->s[k];
    if (!s->set)
        return NVML_ERROR_NOT_SUPPORTED;
    if (s->err)
        return s->err;
    return copy_str(s->str, buf, len);
}

/* One-value device getters share this shape. */
#define DEVICE_UINT_GETTER(fn, key)                                                                \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, unsigned int *out)                                \
    {                                                                                              \
        struct dev *d;                                                                             \
        if (!out)                                                                                  \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        nvmlReturn_t r = enter_dev(device, &d);                                                    \
        if (r)                                                                                     \
            return r;                                                                              \
        return leave(get_uint(d, key, out));                                                       \
    }

/* ---------------------------------------------------------------------------------------------
 * Init and system.
 */

/* The device files a client holds open while it has NVML initialised.  A real driver opens
 * /dev/nvidiactl and /dev/nvidiaN at nvmlInit and closes them when nvmlShutdown brings the
 * reference count to zero (nvml.h: "Shutdown only occurs when the reference count reaches zero",
 * "releasing all GPU resources"), or when the process dies; while any client holds them, a GPU
 * reset is refused (nvidia-smi -r: "There can't be any applications using these devices (e.g. CUDA
 * application, graphics application like X server, monitoring application like other instance of
 * nvidia-smi)") and so is the module unload of a driver upgrade ("driver is in use",
 * gpu-operator #2509).  The fake stands for them with a shared flock on a file of the scenario's own
 * in $TMPDIR (named by an FNV-1a hash of the scenario path, never beside the scenario, which may be
 * a read-only checkout), which tests/fakenvml/runtime.py's gpu_reset() asks for exclusively, as the
 * reset would. */
static int in_use_fd = -1;
static char in_use_path[4096];

static void hold_devices(void)
{
    if (in_use_fd >= 0 || !scenario_path)
        return;
    unsigned long long h = 1469598103934665603ULL;
    for (const char *c = scenario_path; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    const char *tmp = getenv("TMPDIR");
    snprintf(in_use_path, sizeof in_use_path, "%s/fakenvml-inuse-%016llx", tmp && *tmp ? tmp : "/tmp", h);
    const char *path = in_use_path;
    in_use_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (in_use_fd >= 0 && flock(in_use_fd, LOCK_SH) != 0) {
        close(in_use_fd);
        in_use_fd = -1;
    }
}

static void release_devices(void)
{
    if (in_use_fd >= 0) {
        /* The last client removes the file, so that a test run leaves none behind in $TMPDIR. */
        if (flock(in_use_fd, LOCK_EX | LOCK_NB) == 0)
            unlink(in_use_path);
        close(in_use_fd);
        in_use_fd = -1;
    }
}

static nvmlReturn_t do_init(void)
{
    char msg[512];
    pthread_once(&keys_once, init_keys);
    pthread_mutex_lock(&lock);
    if (init_refcount == 0) {
        const char *path = getenv("FAKE_NVML_SCENARIO");
        if (!path || !*path) {
            fprintf(stderr, "fake NVML: FAKE_NVML_SCENARIO is not set; it must name a scenario file\n");
            return leave(NVML_ERROR_UNKNOWN);
        }
        if (!scenario_path || strcmp(scenario_path, path) != 0) {
            free(scenario_path);
            scenario_path = strdup(path);
            free_state(cur);
            cur = NULL;
            free(loaded_text);
            loaded_text = NULL;
            free(rejected_text);
            rejected_text = NULL;
            memset(&loaded_stat, 0, sizeof loaded_stat);
            memset(first_registered_at, 0, sizeof first_registered_at);
            epoch = mono_now();
        }
        if (load(cur == NULL, msg, sizeof msg) < 0 && cur == NULL) {
            fprintf(stderr, "fake NVML: %s\n", msg);
            return leave(NVML_ERROR_UNKNOWN);
        }
        for (int i = 0; i < MAX_GPUS; i++) {
            gpu_handles[i].gpu = i;
            gpu_handles[i].mig = -1;
            for (int m = 0; m < MAX_MIG; m++) {
                mig_handles[i][m].gpu = i;
                mig_handles[i][m].mig = m;
                gi_handles[i][m].gpu = i;
                gi_handles[i][m].mig = m;
            }
        }
    } else {
        load(0, msg, sizeof msg);
    }
    nvmlReturn_t r = driver_error();
    if (r)
        return leave(r);
    if (init_refcount++ == 0)
        hold_devices();
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlInit_v2(void) { return do_init(); }
nvmlReturn_t DECLDIR nvmlInit(void) { return do_init(); }

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init();
}

static int gpm_live_count;

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    pthread_mutex_lock(&lock);
    if (init_refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    init_refcount--;
    if (init_refcount == 0)
        release_devices();
    /* Real drivers free nothing for a careless client; saying it here lets tests catch the leak. */
    if (init_refcount == 0 && gpm_live_count > 0)
        fprintf(stderr, "fake NVML: %d GPM sample(s) still allocated at nvmlShutdown\n", gpm_live_count);
    return leave(NVML_SUCCESS);
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == result)
            return errors[i].text;
    return "Unknown Error";
}

static nvmlReturn_t system_str(int k, char *buf, unsigned int len)
{
    nvmlReturn_t r = enter();
    if (r)
        return r;
    return leave(get_str(&cur->sys, k, buf, len));
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_str(K_DRIVER_VERSION, version, length);
}

nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_str(K_NVML_VERSION, version, length);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    unsigned int v;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    r = get_uint(&cur->sys, K_CUDA_VERSION, &v);
    if (!r)
        *cudaDriverVersion = (int)v;
    return leave(r);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* A name from the scenario's process lines first; otherwise what /proc says, as the driver does. */
nvmlReturn_t DECLDIR nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    nvmlReturn_t r = enter();
    if (r)
        return r;
    for (int g = 0; g < cur->ngpus; g++) {
        for (int i = 0; i < cur->gpu[g]->nprocs; i++) {
            const struct proc *p = &cur->gpu[g]->procs[i];
            if (p->pid != pid)
                continue;
            if (p->name_err)
                return leave(p->name_err);
            if (p->name)
                return leave(copy_str(p->name, name, length));
        }
    }
    pthread_mutex_unlock(&lock);
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n == 0) /* kernel threads and zombies have no command line */
        return NVML_ERROR_NOT_FOUND;
    return copy_str(buf, name, length);
}

/* ---------------------------------------------------------------------------------------------
 * Enumeration and identity.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    *deviceCount = (unsigned int)cur->ngpus;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

/* A GPU whose handle lookup fails (`lookup = !ERROR`).  nvml.h on nvmlDeviceGetHandleByIndex_v2 and
 * nvmlDeviceGetHandleByUUID: the lookup "causes NVML to initialize the target GPU", so a GPU the driver
 * will not initialise answers there, not only in its queries: a GPU that "requires a reset before it
 * can be used again" (NVML_ERROR_RESET_REQUIRED) may refuse its handle at the next lookup while the
 * handle an earlier lookup gave still answers it (issue 49, point 5).  Handles already given out stay
 * valid, as the README says of every handle. */
static nvmlReturn_t lookup_refused(const struct dev *g)
{
    const struct slot *s = &g->s[K_LOOKUP];
    return s->set && s->err ? s->err : NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    if (index >= (unsigned int)cur->ngpus)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu_lost(cur->gpu[index], mono_now()))
        return leave(NVML_ERROR_GPU_IS_LOST);
    nvmlReturn_t refused = lookup_refused(cur->gpu[index]);
    if (refused)
        return leave(refused);
    *device = &gpu_handles[index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static int uuid_is(const struct dev *d, const char *uuid)
{
    const struct slot *s = &d->s[K_UUID];
    return s->set && !s->err && strcmp(s->str, uuid) == 0;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    double now = mono_now();
    for (int g = 0; g < cur->ngpus; g++) {
        const struct dev *gd = cur->gpu[g];
        if (uuid_is(gd, uuid)) {
            if (gpu_lost(gd, now))
                return leave(NVML_ERROR_GPU_IS_LOST);
            if (lookup_refused(gd))
                return leave(lookup_refused(gd));
            *device = &gpu_handles[g];
            return leave(NVML_SUCCESS);
        }
        for (int m = 0; m < gd->nmig; m++) {
            if (uuid_is(gd->mig[m], uuid)) {
                if (gpu_lost(gd, now))
                    return leave(NVML_ERROR_GPU_IS_LOST);
                *device = &mig_handles[g][m];
                return leave(NVML_SUCCESS);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct dev *d;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)device->gpu;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t device_str(nvmlDevice_t device, int k, char *buf, unsigned int len)
{
    struct dev *d;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_str(d, k, buf, len));
}

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return device_str(device, K_NAME, name, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return device_str(device, K_UUID, uuid, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    return device_str(device, K_SERIAL, serial, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct dev *d;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    const struct slot *bus = &d->s[K_PCI_BUS_ID];
    if (!bus->set)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (bus->err)
        return leave(bus->err);
    unsigned int dom = 0, b = 0, dv = 0, fn = 0;
    if (sscanf(bus->str, "%x:%x:%x.%x", &dom, &b, &dv, &fn) != 4)
        return leave(NVML_ERROR_UNKNOWN);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", dom, b, dv, fn);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xffff, b, dv, fn);
    pci->domain = dom;
    pci->bus = b;
    pci->device = dv;
    unsigned int id = 0;
    if (get_uint(d, K_PCI_DEVICE_ID, &id) == NVML_SUCCESS)
        pci->pciDeviceId = id;
    if (get_uint(d, K_PCI_SUBSYSTEM_ID, &id) == NVML_SUCCESS)
        pci->pciSubSystemId = id;
    return leave(NVML_SUCCESS);
}

/* N of /dev/nvidiaN.  nvml.h: "Supported only for Linux", where every GPU has a device node, so a
 * whole GPU without `minor_number` answers its index (the kernel numbers the nodes in probe order,
 * which is the index on common systems; set the key where they differ, or `!NOT_SUPPORTED` for a
 * Windows host).  A MIG handle has no node of its own: NOT_SUPPORTED. */
nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    struct dev *d;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig < 0 && !d->s[K_MINOR].set) {
        *minorNumber = (unsigned int)device->gpu;
        return leave(NVML_SUCCESS);
    }
    return leave(get_uint(d, K_MINOR, minorNumber));
}

/* ---------------------------------------------------------------------------------------------
 * Utilization and memory.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct dev *d;
    unsigned int g, m;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = get_uint(d, K_UTIL_GPU, &g)) || (r = get_uint(d, K_UTIL_MEMORY, &m)))
        return leave(r);
    utilization->gpu = g;
    utilization->memory = m;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t codec_util(nvmlDevice_t device, int kutil, int kperiod, unsigned int *util, unsigned int *period)
{
    struct dev *d;
    if (!util || !period)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = get_uint(d, kutil, util)))
        return leave(r);
    if (get_uint(d, kperiod, period))
        *period = 167000;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                     unsigned int *samplingPeriodUs)
{
    return codec_util(device, K_ENCODER_UTIL, K_ENCODER_PERIOD, utilization, samplingPeriodUs);
}

nvmlReturn_t DECLDIR nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                     unsigned int *samplingPeriodUs)
{
    return codec_util(device, K_DECODER_UTIL, K_DECODER_PERIOD, utilization, samplingPeriodUs);
}

/* memory.used is the v2 meaning (allocations only); v1's used also counts the reserved memory,
 * which is exactly the difference readers of the two structs trip over. */
static nvmlReturn_t memory_values(const struct dev *d, unsigned long long *total, unsigned long long *reserved,
                                  unsigned long long *used, unsigned long long *free_)
{
    nvmlReturn_t r;
    if ((r = get_ull(d, K_MEM_TOTAL, total)) || (r = get_ull(d, K_MEM_USED, used)))
        return r;
    if (get_ull(d, K_MEM_RESERVED, reserved))
        *reserved = 0;
    if (get_ull(d, K_MEM_FREE, free_))
        *free_ = *total > *used + *reserved ? *total - *used - *reserved : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct dev *d;
    unsigned long long total, reserved, used, free_;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = memory_values(d, &total, &reserved, &used, &free_)))
        return leave(r);
    memory->total = total;
    memory->free = free_;
    memory->used = total - free_;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    struct dev *d;
    unsigned long long total, reserved, used, free_;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = memory_values(d, &total, &reserved, &used, &free_)))
        return leave(r);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = free_;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * Thermal, power, clocks.
 */
static nvmlReturn_t gpu_temperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp,
                                    const char *fn)
{
    struct dev *d;
    if (!temp || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev_counted(device, &d, fn);
    if (r)
        return r;
    return leave(get_uint(d, K_TEMP_GPU, temp));
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                              unsigned int *temp)
{
    return gpu_temperature(device, sensorType, temp, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    unsigned int t;
    if (!temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = gpu_temperature(device, temperature->sensorType, &t, __func__);
    if (!r)
        temperature->temperature = (int)t;
    return r;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                                       unsigned int *temp)
{
    struct dev *d;
    if (!temp || (unsigned int)thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_uint(d, K_THRESHOLD0 + (int)thresholdType, temp));
}

nvmlReturn_t DECLDIR nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    struct dev *d;
    if (!numFans)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (d->s[K_FAN_COUNT].set)
        return leave(get_uint(d, K_FAN_COUNT, numFans));
    unsigned int n = 0;
    for (int i = 0; i < MAX_FANS; i++)
        if (d->s[K_FAN0 + i].set)
            n = (unsigned int)i + 1;
    if (n == 0) /* passively cooled */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *numFans = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    struct dev *d;
    if (!speed)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (fan >= MAX_FANS)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(get_uint(d, K_FAN0 + (int)fan, speed));
}

nvmlReturn_t DECLDIR nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return nvmlDeviceGetFanSpeed_v2(device, 0, speed);
}

DEVICE_UINT_GETTER(nvmlDeviceGetPowerUsage, K_POWER_USAGE)
DEVICE_UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, K_POWER_LIMIT)

nvmlReturn_t DECLDIR nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    struct dev *d;
    if (!limit)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_uint(d, d->s[K_POWER_MGMT_LIMIT].set ? K_POWER_MGMT_LIMIT : K_POWER_LIMIT, limit));
}

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    struct dev *d;
    if (!energy)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_ull(d, K_ENERGY, energy));
}

static nvmlReturn_t clock_info(nvmlDevice_t device, int base, nvmlClockType_t type, unsigned int *clock)
{
    struct dev *d;
    if (!clock || (unsigned int)type >= NVML_CLOCK_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_uint(d, base + (int)type, clock));
}

nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return clock_info(device, K_CLOCK0, type, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    return clock_info(device, K_CLOCK_MAX0, type, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    struct dev *d;
    unsigned int p;
    if (!pState)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (!(r = get_uint(d, K_PSTATE, &p)))
        *pState = (nvmlPstates_t)p;
    return leave(r);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    struct dev *d;
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_ull(d, K_EVENT_REASONS, reasons));
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

/* ---------------------------------------------------------------------------------------------
 * PCIe.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    struct dev *d;
    unsigned int v, sample_ms = DEFAULT_PCIE_SAMPLE_MS;
    if (!value || (unsigned int)counter >= NVML_PCIE_UTIL_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    r = get_uint(d, counter == NVML_PCIE_UTIL_TX_BYTES ? K_PCIE_TX_KBPS : K_PCIE_RX_KBPS, &v);
    if (d->s[K_PCIE_SAMPLE_MS].set)
        get_uint(d, K_PCIE_SAMPLE_MS, &sample_ms);
    pthread_mutex_unlock(&lock);
    if (r)
        return r;
    /* The driver samples the link for a while before answering; so do we, without the lock. */
    sleep_ms(sample_ms);
    *value = v;
    return NVML_SUCCESS;
}

DEVICE_UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, K_PCIE_GEN)
DEVICE_UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, K_PCIE_MAX_GEN)
DEVICE_UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, K_PCIE_WIDTH)
DEVICE_UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, K_PCIE_MAX_WIDTH)
DEVICE_UINT_GETTER(nvmlDeviceGetPcieReplayCounter, K_PCIE_REPLAY)

/* ---------------------------------------------------------------------------------------------
 * Field values and NVLink.
 */
/* How many NvLink links the GPU has (NVML_FI_DEV_NVLINK_LINK_COUNT, field 91): `nvlink.count`, else
 * one past the highest link the scenario lists.  -1: the card answers field 91 with NOT_SUPPORTED. */
static int nvlink_count(const struct dev *d)
{
    unsigned int n = 0;
    if (d->s[K_NVLINK_COUNT].set)
        return get_uint(d, K_NVLINK_COUNT, &n) == NVML_SUCCESS ? (int)n : -1;
    for (int i = 0; i < MAX_LINKS; i++)
        if (d->s[K_NVLINK_STATE0 + i].set)
            n = (unsigned int)i + 1;
    return n ? (int)n : -1;
}

/* What a link the GPU does not have answers.  Past the driver's own bound (18 links through R580):
 * INVALID_ARGUMENT (nvml.h: "if device or link is invalid").  Past the GPU's count: the same by
 * default (TensorRT-LLM #17060: a GB200 with 18 links rejects 18..35 with INVALID_ARGUMENT), or,
 * with `nvlink.beyond = 0`, an inactive link with zero counters (what the independent mock library
 * of issue 26 answered for an A100's links 12-17 and every link of an L40S or T4).  A card whose
 * field 91 is NOT_SUPPORTED (a GeForce) has no NVLink: every link answers NOT_SUPPORTED.  A link below the
 * count that the scenario leaves out answers NOT_SUPPORTED: a gap, as the inactive ports of an H100
 * NVL do (DataDog's NVML check, integrations-core nvlink handling). */
static nvmlReturn_t nvlink_absent(const struct dev *d, unsigned int link, int *disabled)
{
    int n = nvlink_count(d);
    *disabled = 0;
    if (link >= cur->profile->nvlink_max || link >= MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* no NVLink at all: nvml.h "doesn't support this feature" */
    if ((int)link < n)
        return NVML_SUCCESS; /* the link exists: its own keys answer */
    const struct slot *b = &d->s[K_NVLINK_BEYOND];
    if (b->set && !b->err) {
        *disabled = 1;
        return NVML_SUCCESS;
    }
    return b->set ? b->err : NVML_ERROR_INVALID_ARGUMENT;
}

/* The GPU's architecture: `arch` where the scenario sets it, else what its name says, as a driver
 * knows its chip (NVML_DEVICE_ARCH_UNKNOWN, "presumably something newer", for a name not listed). */
static nvmlReturn_t gpu_arch(const struct dev *d, unsigned int *arch)
{
    if (d->s[K_ARCH].set)
        return get_uint(d, K_ARCH, arch);
    static const struct {
        const char *part;
        unsigned int arch;
    } by_name[] = {
        {"B200", NVML_DEVICE_ARCH_BLACKWELL}, {"B100", NVML_DEVICE_ARCH_BLACKWELL},
        {"RTX PRO 6000", NVML_DEVICE_ARCH_BLACKWELL}, {"H100", NVML_DEVICE_ARCH_HOPPER},
        {"H200", NVML_DEVICE_ARCH_HOPPER}, {"H20", NVML_DEVICE_ARCH_HOPPER}, {"Ada", NVML_DEVICE_ARCH_ADA},
        {"L40", NVML_DEVICE_ARCH_ADA}, {"L4", NVML_DEVICE_ARCH_ADA}, {"RTX 40", NVML_DEVICE_ARCH_ADA},
        {"A100", NVML_DEVICE_ARCH_AMPERE}, {"A10", NVML_DEVICE_ARCH_AMPERE}, {"A30", NVML_DEVICE_ARCH_AMPERE},
        {"A40", NVML_DEVICE_ARCH_AMPERE}, {"RTX 30", NVML_DEVICE_ARCH_AMPERE}, {"T4", NVML_DEVICE_ARCH_TURING},
        {"V100", NVML_DEVICE_ARCH_VOLTA},
    };
    const char *name = d->s[K_NAME].set && d->s[K_NAME].str ? d->s[K_NAME].str : "";
    *arch = NVML_DEVICE_ARCH_UNKNOWN;
    for (size_t i = 0; i < sizeof by_name / sizeof by_name[0]; i++)
        if (strstr(name, by_name[i].part)) {
            *arch = by_name[i].arch;
            break;
        }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    struct dev *d;
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    unsigned int a;
    if (!(r = gpu_arch(d, &a)))
        *arch = a;
    return leave(r);
}

static int is_nvlink5(const struct dev *d)
{
    unsigned int a;
    return gpu_arch(d, &a) == NVML_SUCCESS && a != NVML_DEVICE_ARCH_UNKNOWN && a >= NVML_DEVICE_ARCH_BLACKWELL;
}

/* A value written as `valueType` says; with `fields.accumulate` set, added to what the caller's
 * struct already held, as go-nvml #46 reports of a real driver ("18, 28, 38, 48 ... increase
 * linearly" through one reused array): only a caller that zeroes its array reads true values. */
static void put_value(const struct dev *d, nvmlFieldValue_t *fv, nvmlValueType_t type, long double v)
{
    int acc = d->s[K_FIELDS_ACCUMULATE].set && !d->s[K_FIELDS_ACCUMULATE].err && d->s[K_FIELDS_ACCUMULATE].base;
    fv->valueType = type;
    if (!acc && type != NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
        memset(&fv->value, 0xA5, sizeof fv->value); /* the union's other bytes are undefined: only `type` says */
    switch (type) {
    case NVML_VALUE_TYPE_UNSIGNED_INT:
        fv->value.uiVal = (acc ? fv->value.uiVal : 0) + (unsigned int)v;
        break;
    case NVML_VALUE_TYPE_UNSIGNED_SHORT:
        fv->value.usVal = (unsigned short)((acc ? fv->value.usVal : 0) + (unsigned short)v);
        break;
    default:
        fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        fv->value.ullVal = (acc ? fv->value.ullVal : 0) + (v >= 18446744073709551615.0L ? ULLONG_MAX
                                                                                        : (unsigned long long)v);
    }
}

/* One field of nvmlDeviceGetFieldValues.  Only `fieldId` and `scopeId` are read from the caller. */
static void field_value(const struct dev *d, nvmlFieldValue_t *fv, long long now_us)
{
    unsigned int link = fv->scopeId;
    long double v = 0;
    int k = -1, disabled = 0;
    nvmlValueType_t type = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    fv->timestamp = now_us;
    fv->latencyUsec = 0;
    if (fv->fieldId >= cur->profile->fi_max) {
        /* An id this branch's nvml.h does not define (fields 197/198 on R535): the per-entry answer
         * is `unknown_field` of [system], INVALID_ARGUMENT unless a scenario says otherwise. */
        const struct slot *u = &cur->sys.s[K_UNKNOWN_FIELD];
        fv->nvmlReturn = u->set && u->err ? u->err : NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
    switch (fv->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP: {
        unsigned int t = NVML_VALUE_TYPE_UNSIGNED_INT;
        k = K_TEMP_MEMORY;
        if (d->s[K_TEMP_MEMORY_TYPE].set)
            get_uint(d, K_TEMP_MEMORY_TYPE, &t);
        type = (nvmlValueType_t)t;
        break;
    }
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY:
        k = K_ENERGY;
        break;
    /* The perf-policy counters (nvml.h: "Perf Policy Counter for ... Policy"; the clocks-event-reason
     * counters that share ids 74 and 76 are "in nanoseconds"), as unsigned long long. */
    case NVML_FI_DEV_PERF_POLICY_POWER:
    case NVML_FI_DEV_PERF_POLICY_THERMAL:
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST:
    case NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT:
    case NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION:
    case NVML_FI_DEV_PERF_POLICY_RELIABILITY:
        k = K_VIOLATION0 + (int)(fv->fieldId - NVML_FI_DEV_PERF_POLICY_POWER);
        break;
    /* The clock event reason counters ("in ns"), ids 269-271 from nvidia-ml-py 13.580.82's nvml.h on: R570's
     * NVML_FI_MAX (269) is below them, so that profile answers them as unknown ids. */
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN:
        k = K_CLOCK_EVENT0 + (int)(fv->fieldId - NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN);
        break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        k = K_PCIE_REPLAY;
        break;
    /* The driver's verdict (nvml.h: "GPU Recovery action. See nvmlDeviceGpuRecoveryAction_t"), new in
     * driver 565 (NVIDIA's release notes, as k8s-device-plugin #1241 quotes them): R550's NVML_FI_MAX
     * (228) is below it, so that profile answers it as an unknown id.  An enum: an unsigned int. */
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        k = K_RECOVERY_ACTION;
        type = NVML_VALUE_TYPE_UNSIGNED_INT;
        break;
    /* A GPU joined to a Grace CPU by NVLink-C2C (c2c.enabled, what nvmlDeviceGetC2cModeInfoV's
     * isC2cEnabled says) counts from 0.  Any other answers as Datadog's agent found real drivers do
     * (its fields.go marks exactly these three markUnsupportedOnInvalidArgument: "Some fields on older
     * architectures return INVALID_ARGUMENT immediately instead of cleanly reporting
     * ERROR_NOT_SUPPORTED"): INVALID_ARGUMENT before Hopper, NOT_SUPPORTED on a Hopper or newer
     * without C2C (an H100 on PCIe or HGX).  A driver whose nvml.h skips the ids (570 and older)
     * answers them as unknown. */
    case NVML_FI_DEV_C2C_LINK_ERROR_INTR:
    case NVML_FI_DEV_C2C_LINK_ERROR_REPLAY:
    case NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B: {
        unsigned int arch = NVML_DEVICE_ARCH_UNKNOWN;
        const struct slot *on = &d->s[K_C2C_ENABLED];
        if (!cur->profile->c2c_errors) {
            fv->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
            return;
        }
        if (on->set && on->err) {
            fv->nvmlReturn = on->err;
            return;
        }
        if (!on->set || !on->base) {
            fv->nvmlReturn = gpu_arch(d, &arch) == NVML_SUCCESS && arch != NVML_DEVICE_ARCH_UNKNOWN &&
                                     arch < NVML_DEVICE_ARCH_HOPPER
                                 ? NVML_ERROR_INVALID_ARGUMENT
                                 : NVML_ERROR_NOT_SUPPORTED;
            return;
        }
        k = K_C2C_ERR0 + (int)(fv->fieldId - NVML_FI_DEV_C2C_LINK_ERROR_INTR);
        if (!d->s[k].set) {
            put_value(d, fv, type, 0);
            return;
        }
        break;
    }
    case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
    case NVML_FI_DEV_PCIE_COUNT_RX_BYTES: {
        /* nvml.h: "Value can be wrapped".  With pcie.counter_bits = 32 the counter wraps at 2^32 and
         * is still answered as unsigned long long, as the readings in dcgm-exporter #721 (an L40S,
         * all below 2^32) suggest. */
        unsigned int bits = 64;
        fv->nvmlReturn = get_num(d, fv->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES ? K_PCIE_TX_BYTES : K_PCIE_RX_BYTES, &v);
        if (fv->nvmlReturn == NVML_SUCCESS && d->s[K_PCIE_COUNTER_BITS].set && !get_uint(d, K_PCIE_COUNTER_BITS, &bits) &&
            bits < 64)
            v = (long double)((unsigned long long)v & ((1ULL << bits) - 1));
        if (fv->nvmlReturn == NVML_SUCCESS)
            put_value(d, fv, type, v);
        return;
    }
    case NVML_FI_DEV_NVLINK_LINK_COUNT: {
        int n = nvlink_count(d);
        fv->nvmlReturn = n >= 0 ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
        if (n >= 0)
            put_value(d, fv, NVML_VALUE_TYPE_UNSIGNED_INT, n);
        return;
    }
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES: {
        /* KiB counters (138/139) through NVLink 4; Blackwell's NVLink 5 counts bytes (202/204, "Total
         * Tx bytes on the link in NVLink5") and, as the issue's review found, not the KiB ones. */
        int bytes = fv->fieldId == NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES || fv->fieldId == NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES;
        if (bytes != is_nvlink5(d)) {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            return;
        }
        if ((fv->nvmlReturn = nvlink_absent(d, link, &disabled)) != NVML_SUCCESS)
            return;
        if (disabled) {
            put_value(d, fv, type, 0);
            return;
        }
        int tx = fv->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX || fv->fieldId == NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES;
        fv->nvmlReturn = get_num(d, (tx ? K_NVLINK_TX0 : K_NVLINK_RX0) + (int)link, &v);
        if (fv->nvmlReturn == NVML_SUCCESS)
            put_value(d, fv, type, bytes ? v * 1024 : v); /* the scenario gives KiB */
        return;
    }
    default:
        for (int e = 0; e < NVLINK_ERRORS; e++) {
            if (fv->fieldId != nvlink_errors[e].field)
                continue;
            /* A generation's own counters answer (0 where the scenario gives none, as a healthy
             * link's); the other generation's are NOT_SUPPORTED. */
            if (nvlink_errors[e].nvlink5 != is_nvlink5(d)) {
                fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                return;
            }
            if ((fv->nvmlReturn = nvlink_absent(d, link, &disabled)) != NVML_SUCCESS)
                return;
            k = K_NVLINK_ERR0 + (int)link * NVLINK_ERRORS + e;
            if (disabled || !d->s[k].set) {
                put_value(d, fv, type, 0);
                return;
            }
            break;
        }
        if (k < 0) {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            return;
        }
    }
    fv->nvmlReturn = get_num(d, k, &v);
    if (fv->nvmlReturn == NVML_SUCCESS)
        put_value(d, fv, type, v);
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    struct dev *d;
    if (!values || valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    long long now_us = wall_now_us();
    for (int i = 0; i < valuesCount; i++)
        field_value(d, &values[i], now_us);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    struct dev *d;
    unsigned int v;
    int disabled;
    if (!isActive)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = nvlink_absent(d, link, &disabled)))
        return leave(r);
    if (disabled) {
        *isActive = NVML_FEATURE_DISABLED;
        return leave(NVML_SUCCESS);
    }
    if (!(r = get_uint(d, K_NVLINK_STATE0 + (int)link, &v)))
        *isActive = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(r);
}

/* ---------------------------------------------------------------------------------------------
 * Errors.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    struct dev *d;
    if (!eccCounts || (unsigned int)errorType > 1 || (unsigned int)counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(get_ull(d, K_ECC0 + (int)errorType * 2 + (int)counterType, eccCounts));
}

nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                               unsigned int *isPending, unsigned int *failureOccurred)
{
    struct dev *d;
    unsigned int c, u, p, f;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if ((r = get_uint(d, K_ROWS_CORRECTABLE, &c)) || (r = get_uint(d, K_ROWS_UNCORRECTABLE, &u)) ||
        (r = get_uint(d, K_ROWS_PENDING, &p)) || (r = get_uint(d, K_ROWS_FAILURE, &f)))
        return leave(r);
    *corrRows = c;
    *uncRows = u;
    *isPending = p;
    *failureOccurred = f;
    return leave(NVML_SUCCESS);
}

/* The GPU's NVLink fabric.  nvml.h: "For Hopper or newer fully supported devices"; NOT_SUPPORTED
 * "If device doesn't support gpu fabric"; the caller sets the version, v2 (health mask) or v3 (health
 * summary, appended); `status` "Must be checked only if state returns complete".  A state of 0
 * (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) with SUCCESS is what a GPU without a fabric may answer too. */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    struct dev *d;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d); /* FUNCTION_NOT_FOUND before 550 (introduced[]) */
    if (r)
        return r;
    unsigned int newest = cur->profile->fabric_version;
    if (!(info->version == nvmlGpuFabricInfo_v2 || (info->version == nvmlGpuFabricInfo_v3 && newest >= 3)))
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (device->mig >= 0 || !d->s[K_FABRIC_STATE].set)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int state, status = 0, mask = 0, summary = 0, clique = 0;
    if ((r = get_uint(d, K_FABRIC_STATE, &state)))
        return leave(r);
    if ((d->s[K_FABRIC_STATUS].set && (r = get_uint(d, K_FABRIC_STATUS, &status))) ||
        (d->s[K_FABRIC_HEALTH_MASK].set && (r = get_uint(d, K_FABRIC_HEALTH_MASK, &mask))) ||
        (d->s[K_FABRIC_HEALTH_SUMMARY].set && (r = get_uint(d, K_FABRIC_HEALTH_SUMMARY, &summary))) ||
        (d->s[K_FABRIC_CLIQUE].set && (r = get_uint(d, K_FABRIC_CLIQUE, &clique))))
        return leave(r);
    unsigned int version = info->version;
    nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)info; /* v3 begins with v2's fields */
    memset(v2->clusterUuid, 0, sizeof v2->clusterUuid);
    v2->clusterUuid[0] = 0x42; /* one cluster for the node's GPUs */
    v2->status = (nvmlReturn_t)status;
    v2->cliqueId = clique;
    v2->state = (nvmlGpuFabricState_t)state;
    v2->healthMask = mask;
    if (version == nvmlGpuFabricInfo_v3)
        info->healthSummary = (unsigned char)summary;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * Processes.  The two-call protocol: a count too small (or no buffer) gets INSUFFICIENT_SIZE
 * together with the count needed.  The struct versions differ in layout, which is the point.
 */
static int proc_matches(const struct proc *p, enum proc_kind kind, nvmlDevice_t h, const struct dev *d)
{
    if (p->kind != kind)
        return 0;
    if (h->mig < 0)
        return 1;
    unsigned int gi = NO_INSTANCE, ci = NO_INSTANCE;
    get_uint(d, K_GPU_INSTANCE_ID, &gi);
    get_uint(d, K_COMPUTE_INSTANCE_ID, &ci);
    return p->gi == gi && (p->ci == NO_INSTANCE || ci == NO_INSTANCE || p->ci == ci);
}

/* `fn`: the entry point, so that each version is counted (and can be missing) under its own name. */
static nvmlReturn_t running_processes(nvmlDevice_t device, enum proc_kind kind, unsigned int *count, void *infos,
                                      int version, const char *fn)
{
    struct dev *d, *g;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev_counted(device, &d, fn);
    if (r)
        return r;
    resolve(device, &d, &g);
    static const int refusals[] = {[PROC_COMPUTE] = K_PROCS_COMPUTE, [PROC_GRAPHICS] = K_PROCS_GRAPHICS,
                                   [PROC_MPS] = K_PROCS_MPS};
    const struct slot *refuse = &d->s[refusals[kind]];
    if (refuse->set && refuse->err)
        return leave(refuse->err);
    unsigned int n = 0;
    for (int i = 0; i < g->nprocs; i++)
        n += (unsigned int)proc_matches(&g->procs[i], kind, device, d);
    if (*count < n || (!infos && n > 0)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int j = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const struct proc *p = &g->procs[i];
        if (!proc_matches(p, kind, device, d))
            continue;
        if (version == 1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + j;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
        } else if (version == 3 && cur->profile->v3_record == sizeof(nvmlProcessDetail_v1_t)) {
            /* R535's nvmlProcessInfo_t: this header's nvmlProcessDetail_v1_t is the same layout (the
             * profile's note); no confidential computing here, so no protected memory. */
            nvmlProcessDetail_v1_t *o = (nvmlProcessDetail_v1_t *)infos + j;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
            o->gpuInstanceId = p->gi;
            o->computeInstanceId = p->ci;
            o->usedGpuCcProtectedMemory = 0;
        } else {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + j;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
            o->gpuInstanceId = p->gi;
            o->computeInstanceId = p->ci;
        }
        j++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    return running_processes(device, PROC_COMPUTE, infoCount, infos, 3, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, PROC_COMPUTE, infoCount, infos, 2, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, PROC_COMPUTE, infoCount, infos, 1, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    return running_processes(device, PROC_GRAPHICS, infoCount, infos, 3, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, PROC_GRAPHICS, infoCount, infos, 2, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, PROC_GRAPHICS, infoCount, infos, 1, __func__);
}

/* The clients of an MPS server (`mps` process lines), in the three layouts nvml.h declares: the
 * unversioned and _v2 symbols since CUDA 11.4 (R470), _v3 since 11.6 (R510), as NVIDIA's go-nvml
 * copies of each nvml.h show.  "For Volta or newer": an older card answers NOT_SUPPORTED
 * (`processes.mps = !NOT_SUPPORTED`).  Without an MPS server the list is empty (SUCCESS). */
nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return running_processes(device, PROC_MPS, infoCount, infos, 3, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, PROC_MPS, infoCount, infos, 2, __func__);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, PROC_MPS, infoCount, infos, 1, __func__);
}

/* The versioned process list (R550 on, introduced[]).  nvml.h: "For Hopper or newer fully supported
 * devices"; the caller sets `version` and `mode` (compute, graphics, MPS, or all three), a NULL
 * procArray or too few entries gets INSUFFICIENT_SIZE with the count, no process SUCCESS. */
nvmlReturn_t DECLDIR nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
    struct dev *d, *g;
    if (!plist)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    resolve(device, &d, &g);
    unsigned int arch = NVML_DEVICE_ARCH_UNKNOWN;
    if (gpu_arch(g, &arch) == NVML_SUCCESS && arch != NVML_DEVICE_ARCH_UNKNOWN && arch < NVML_DEVICE_ARCH_HOPPER)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (plist->version != nvmlProcessDetailList_v1 || plist->mode > NVML_PROCESS_MODE_ALL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    static const enum proc_kind kinds[] = {[NVML_PROCESS_MODE_COMPUTE] = PROC_COMPUTE,
                                           [NVML_PROCESS_MODE_GRAPHICS] = PROC_GRAPHICS, [NVML_PROCESS_MODE_MPS] = PROC_MPS};
    unsigned int n = 0;
    for (int i = 0; i < g->nprocs; i++)
        for (unsigned int m = 0; m < NVML_PROCESS_MODE_ALL; m++)
            n += (plist->mode == m || plist->mode == NVML_PROCESS_MODE_ALL) &&
                 proc_matches(&g->procs[i], kinds[m], device, d);
    if (plist->numProcArrayEntries < n || (!plist->procArray && n > 0)) {
        plist->numProcArrayEntries = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int j = 0;
    for (int i = 0; i < g->nprocs; i++)
        for (unsigned int m = 0; m < NVML_PROCESS_MODE_ALL; m++) {
            const struct proc *p = &g->procs[i];
            if (!((plist->mode == m || plist->mode == NVML_PROCESS_MODE_ALL) && proc_matches(p, kinds[m], device, d)))
                continue;
            nvmlProcessDetail_v1_t *o = &plist->procArray[j++];
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
            o->gpuInstanceId = p->gi;
            o->computeInstanceId = p->ci;
            o->usedGpuCcProtectedMemory = 0;
        }
    plist->numProcArrayEntries = n;
    return leave(NVML_SUCCESS);
}

/* Confidential computing's memory split (R535 on, introduced[]): nvml.h "For Ampere or newer"; no
 * scenario turns confidential computing on, so every GPU answers NOT_SUPPORTED, as one without it. */
nvmlReturn_t DECLDIR nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *memInfo)
{
    struct dev *d;
    if (!memInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

/* ---------------------------------------------------------------------------------------------
 * MIG.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    struct dev *d;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int mode;
    if ((r = get_uint(d, K_MIG_MODE, &mode)))
        return leave(r);
    *currentMode = mode;
    if (get_uint(d, K_MIG_PENDING, pendingMode))
        *pendingMode = mode;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct dev *d;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0 || !d->s[K_MIG_MODE].set)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (d->s[K_MIG_MAX_DEVICES].set)
        return leave(get_uint(d, K_MIG_MAX_DEVICES, count));
    *count = 7;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    struct dev *d;
    unsigned int mode = 0;
    if (!migDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->s[K_MIG_MODE].set)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    get_uint(d, K_MIG_MODE, &mode);
    if (!mode || index >= (unsigned int)d->nmig)
        return leave(NVML_ERROR_NOT_FOUND);
    const struct slot *h = &d->mig[index]->s[K_MIG_HANDLE];
    if (h->set && h->err)
        return leave(h->err);
    *migDevice = &mig_handles[device->gpu][index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    struct dev *d;
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    *isMigDevice = device->mig >= 0;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(nvmlDevice_t device, int k, unsigned int *id)
{
    struct dev *d;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig < 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(get_uint(d, k, id));
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, K_GPU_INSTANCE_ID, id);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, K_COMPUTE_INSTANCE_ID, id);
}

nvmlReturn_t DECLDIR nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    struct dev *d;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(migDevice, &d);
    if (r)
        return r;
    if (migDevice->mig < 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpu_handles[migDevice->gpu];
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * GPU instances: nvmlDeviceGetGpuInstanceById on the parent, then nvmlGpuInstanceGetInfo, which
 * says the instance's profile id and the memory slices it occupies (its placement).
 *
 * The profile id is the one nvmlDeviceGetGpuInstanceProfileInfo answers in `id` ("Unique profile ID
 * within the device", nvml.h), the number `nvidia-smi mig -lgip` shows and `-cgi` takes, not the
 * NVML_GPU_INSTANCE_PROFILE_* index passed to that call: on an A100 or H100, 1g 19, 1g+me 20, 1g
 * with two memory slices (1g.20gb on an 80 GB card) 15, 2g 14, 3g 9, 4g 5, 7g 0 (nvidia-smi mig
 * -lgip/-lgipp output, as quoted by NVIDIA's H100 NVL MIG post; NVIDIA's DRA driver matches
 * giInfo.ProfileId against that profile info's Id).  Possible placements there, as `-lgipp` lists
 * them, {starts}:size over 8 memory slices: 19 and 20 {0..6}:1, 15 {0,2,4,6}:2, 14 {0,2,4}:2,
 * 9 {0,4}:4, 5 {0}:4, 0 {0}:8.
 *
 * A MIG section without `gi.profile_id` takes it from its name ("... MIG 3g.40gb"), and one without
 * `gi.placement.start` the first possible start not taken by an earlier GPU instance of the file: a
 * valid layout, not necessarily the one the driver chose (the DRA driver: no guaranteed relation
 * between GI id and placement).  nvml.h: GetGpuInstanceById "Requires privileged user"; without the
 * mig/monitor capability (MIG user guide, "Device Nodes and Capabilities": root, CAP_SYS_ADMIN, or
 * access to the capability) it fails, which `gi.lookup = !NO_PERMISSION` on the GPU models.
 */
static const struct {
    unsigned int id, size, starts; /* starts: bit s set where the instance may begin at slice s */
} gi_profiles[] = {
    {19, 1, 0x7f}, {20, 1, 0x7f}, {15, 2, 0x55}, {14, 2, 0x15}, {9, 4, 0x11}, {5, 4, 0x01}, {0, 8, 0x01},
};
#define NGI_PROFILES ((int)(sizeof gi_profiles / sizeof gi_profiles[0]))

/* The profile a MIG device's name says, as an A100 or H100 numbers it. */
static unsigned int gi_profile_of_name(const struct dev *mig, const struct dev *g)
{
    const struct slot *n = &mig->s[K_NAME];
    const char *at = n->set && !n->err && n->str ? strstr(n->str, "MIG ") : NULL;
    unsigned int slices = 1, gb = 0;
    if (!at || sscanf(at + 4, "%ug.%ugb", &slices, &gb) < 1)
        return 19;
    switch (slices) {
    case 7:
        return 0;
    case 4:
        return 5;
    case 3:
        return 9;
    case 2:
        return 14;
    default:
        break;
    }
    if (strstr(at, "+me"))
        return 20;
    /* Two memory slices: a name whose memory is twice an eighth of the card's (1g.20gb of 80 GB). */
    long double total;
    if (gb && get_num(g, K_MEM_TOTAL, &total) == NVML_SUCCESS && total > 0 &&
        (long double)gb * 8.0L > 1.5L * total / (1024.0L * 1024.0L * 1024.0L))
        return 15;
    return 19;
}

/* The first section of GPU `g` that carries GPU instance `id`, or -1. */
static int gi_section(const struct dev *g, unsigned int id)
{
    for (int m = 0; m < g->nmig; m++) {
        unsigned int gi;
        if (get_uint(g->mig[m], K_GPU_INSTANCE_ID, &gi) == NVML_SUCCESS && gi == id)
            return m;
    }
    return -1;
}

/* A MIG section's value for `k`, or `dflt` where the key is unset.  A key set to an error answers
 * `dflt` too, for the layout of the other instances (which one failing call does not move), and
 * leaves the error in *err for the instance's own answer. */
static unsigned int gi_value(const struct dev *d, int k, unsigned int dflt, nvmlReturn_t *err)
{
    unsigned int v;
    if (!d->s[k].set)
        return dflt;
    nvmlReturn_t r = get_uint(d, k, &v);
    if (r) {
        if (!*err)
            *err = r;
        return dflt;
    }
    return v;
}

/* Profile and placement of the GPU instance whose first section is `want`, laying out the GPU's
 * instances in file order.  Called with the lock held. */
static nvmlReturn_t gi_layout(const struct dev *g, int want, nvmlGpuInstanceInfo_t *info)
{
    unsigned int taken = 0;
    for (int m = 0; m <= want && m < g->nmig; m++) {
        const struct dev *d = g->mig[m];
        unsigned int id, size = 1, starts = 0xff;
        if (get_uint(d, K_GPU_INSTANCE_ID, &id) != NVML_SUCCESS || gi_section(g, id) != m)
            continue; /* no instance id, or another compute instance of an instance already laid out */
        nvmlReturn_t err = NVML_SUCCESS;
        unsigned int profile = gi_value(d, K_GI_PROFILE_ID, gi_profile_of_name(d, g), &err);
        for (int i = 0; i < NGI_PROFILES; i++)
            if (gi_profiles[i].id == profile) {
                size = gi_profiles[i].size;
                starts = gi_profiles[i].starts;
            }
        size = gi_value(d, K_GI_PLACEMENT_SIZE, size, &err);
        unsigned int span = size >= 32 ? 0xffffffffu : (1u << size) - 1, start = UINT_MAX;
        for (unsigned int s = 0; s < 8 && start == UINT_MAX; s++)
            if ((starts >> s & 1) && !(taken & span << s))
                start = s;
        if (start == UINT_MAX) /* more instances than fit: the scenario's doing, not the driver's */
            for (unsigned int s = 0; s < 8 && start == UINT_MAX; s++)
                if (starts >> s & 1)
                    start = s;
        start = gi_value(d, K_GI_PLACEMENT_START, start, &err);
        if (start < 32)
            taken |= span << start;
        if (m == want) {
            if (err)
                return err;
            info->id = id;
            info->profileId = profile;
            info->placement.start = start;
            info->placement.size = size;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    struct dev *d;
    unsigned int mode = 0;
    if (!gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* "The identifier of the target device": the GPU */
    if (get_uint(d, K_MIG_MODE, &mode) != NVML_SUCCESS || !mode)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* "If device doesn't have MIG mode enabled" */
    const struct slot *refuse = &d->s[K_GI_LOOKUP];
    if (refuse->set && refuse->err)
        return leave(refuse->err);
    int m = gi_section(d, id);
    if (m < 0)
        return leave(NVML_ERROR_NOT_FOUND); /* "If the GPU instance is not found" */
    refuse = &d->mig[m]->s[K_GI_LOOKUP];
    if (refuse->set && refuse->err)
        return leave(refuse->err);
    *gpuInstance = &gi_handles[device->gpu][m];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    struct dev *g;
    const struct nvmlGpuInstance_st *first = &gi_handles[0][0];
    if (!info || gpuInstance < first || gpuInstance >= first + MAX_GPUS * MAX_MIG ||
        ((const char *)gpuInstance - (const char *)first) % sizeof *gpuInstance != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(&gpu_handles[gpuInstance->gpu], &g);
    if (r)
        return r;
    /* A reload that destroyed the instance (or moved its id) leaves the handle pointing at nothing. */
    const int m = gpuInstance->mig;
    unsigned int id;
    if (m >= g->nmig || get_uint(g->mig[m], K_GPU_INSTANCE_ID, &id) != NVML_SUCCESS || gi_section(g, id) != m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlGpuInstanceInfo_t out;
    memset(&out, 0, sizeof out);
    if ((r = gi_layout(g, m, &out)))
        return leave(r);
    out.device = &gpu_handles[gpuInstance->gpu];
    *info = out;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * XID events.  An `xid` line is an event that occurs `after` seconds from the first nvmlInit of
 * the scenario, or when the line is added to the file if that is later.  Each event set delivers,
 * once and in file order, the events of the GPUs it watches that occurred once it watched them:
 * nvml.h, nvmlDeviceRegisterEvents "Starts recording of events on a specified devices and add the
 * events to specified nvmlEventSet_t", so an event that occurs while no set of the client watches
 * its GPU (between freeing one set and registering the next) is lost, as with a real driver.  An
 * event due before its GPU was first registered in this process waits for that registration
 * instead: a test cannot know when the exporter it starts will register, and an XID before the
 * exporter started is not what it tests.
 */
nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_MEMORY);
}

static int valid_set(nvmlEventSet_t set)
{
    return set >= &event_sets[0] && set < &event_sets[MAX_EVENT_SETS] && set->used;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t r = enter();
    if (r)
        return r;
    if (!valid_set(set))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    set->used = 0;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t supported_events(const struct dev *d, unsigned long long *mask)
{
    if (!d->s[K_EVENTS_SUPPORTED].set) {
        *mask = DEFAULT_SUPPORTED_EVENTS;
        return NVML_SUCCESS;
    }
    return get_ull(d, K_EVENTS_SUPPORTED, mask);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct dev *d;
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (device->mig >= 0)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(supported_events(d, eventTypes));
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    struct dev *d;
    unsigned long long supported;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (!valid_set(set) || device->mig >= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((r = supported_events(d, &supported)))
        return leave(r);
    if (eventTypes & ~supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    set->mask[device->gpu] |= eventTypes;
    double now = mono_now();
    if (!set->registered_at[device->gpu])
        set->registered_at[device->gpu] = now;
    if (!first_registered_at[device->gpu])
        first_registered_at[device->gpu] = now;
    return leave(NVML_SUCCESS);
}

static int wait_lost(int g, double now)
{
    const struct slot *q = &cur->gpu[g]->s[K_EVENTS_WAIT_LOST];
    return q->set && !q->err && q->base && gpu_lost(cur->gpu[g], now);
}

/* The GPU whose event sets receive GPU g's events: g itself, or the `events.via` quirk's GPU.
 * nvml.h names the GPU an event occurred on in the event (nvmlEventData_t.device, "Specific device
 * where the event occurred"), not by the set it arrives in; NVIDIA's own mock library
 * (NVIDIA/k8s-test-infra, pkg/gpu/mocknvml/bridge/events.go) registers nothing per set and hands each
 * injected Xid to whichever set waits first, its device in `data.device`.  The quirk makes that
 * deterministic: GPU g's XIDs arrive only in the sets that watch GPU `via`. */
static int event_route(int g)
{
    unsigned int via;
    if (get_uint(cur->gpu[g], K_EVENTS_VIA, &via) == NVML_SUCCESS && (int)via < cur->ngpus && cur->gpu[via])
        return (int)via;
    return g;
}

/* With the lock held: the next due event for this set, if any (`lost_only`: only of GPUs whose
 * loss the wait reports). */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data, double now, int lost_only)
{
    for (int g = 0; g < cur->ngpus; g++) {
        int w = event_route(g); /* the GPU whose registration receives g's events */
        if (!(set->mask[w] & nvmlEventTypeXidCriticalError) || (lost_only && !wait_lost(g, now)))
            continue;
        const struct dev *gd = cur->gpu[g];
        int i = set->delivered[g];
        double due = 0;
        for (; i < gd->nxids; i++) { /* skip those that occurred before this set watched the GPU */
            const struct xid *x = &gd->xids[i];
            due = epoch + x->after_s;
            if (x->seen_at > due)
                due = x->seen_at;
            if (first_registered_at[w] > due)
                due = first_registered_at[w];
            if (due >= set->registered_at[w])
                break;
        }
        set->delivered[g] = i;
        if (i >= gd->nxids || now < due)
            continue;
        set->delivered[g] = i + 1;
        memset(data, 0, sizeof *data);
        data->device = &gpu_handles[g];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = gd->xids[i].code;
        data->gpuInstanceId = gd->xids[i].gi;
        data->computeInstanceId = gd->xids[i].ci;
        return 1;
    }
    return 0;
}

/* With the lock held: whether a GPU of this set with `events.wait_lost` has fallen off the bus.
 * nvml.h on nvmlEventSetWait_v2: NVML_ERROR_GPU_IS_LOST "if a GPU has fallen off the bus or is
 * otherwise inaccessible".  The lost GPU's own events already due (its XID 79) come first; then
 * every wait on the set answers GPU_IS_LOST, whatever the other GPUs have (issue 26, point 5). */
static int lost_in_set(nvmlEventSet_t set, double now)
{
    for (int g = 0; g < cur->ngpus; g++)
        if (set->mask[g] && wait_lost(g, now))
            return 1;
    return 0;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = mono_now() + timeoutms / 1000.0;
    for (;;) {
        nvmlReturn_t r = enter();
        if (r)
            return r;
        if (!valid_set(set))
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        double now = mono_now();
        if (next_event(set, data, now, 1))
            return leave(NVML_SUCCESS);
        if (lost_in_set(set, now))
            return leave(NVML_ERROR_GPU_IS_LOST);
        if (next_event(set, data, now, 0))
            return leave(NVML_SUCCESS);
        pthread_mutex_unlock(&lock);
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        /* The driver blocks until an event; the fake looks again every 50 ms (a scenario file may
         * have changed), so that an idle waiter costs next to nothing, as with the driver. */
        double left_ms = (deadline - now) * 1000;
        sleep_ms(left_ms < 50 ? left_ms : 50);
    }
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ---------------------------------------------------------------------------------------------
 * Per-process utilization.  The driver samples every `process_util.sample_ms`; one sample per
 * process that was busy (any non-zero value) is returned for the latest sample period, if that
 * period is newer than lastSeenTimeStamp.  No such sample: NOT_FOUND, as nvml.h documents.
 * Processes and their values come from the process lines' sm= mem= enc= dec= words.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp)
{
    struct dev *d, *g;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    resolve(device, &d, &g);
    unsigned int mode = 0;
    if (device->mig >= 0 || (get_uint(g, K_MIG_MODE, &mode) == NVML_SUCCESS && mode))
        return leave(NVML_ERROR_NOT_SUPPORTED); /* "On MIG-enabled GPUs ... not currently supported" */
    long double period_ms;
    if ((r = get_num(g, K_PROC_UTIL_SAMPLE_MS, &period_ms)))
        return leave(r);
    if (period_ms < 1)
        period_ms = 1;
    unsigned long long now_us = (unsigned long long)wall_now_us();
    unsigned long long period_us = (unsigned long long)(period_ms * 1000);
    unsigned long long sample_us = now_us / period_us * period_us;
    unsigned int n = 0;
    if (sample_us > lastSeenTimeStamp)
        for (int i = 0; i < g->nprocs; i++)
            n += (g->procs[i].util[0] | g->procs[i].util[1] | g->procs[i].util[2] | g->procs[i].util[3]) != 0;
    if (n == 0) {
        *processSamplesCount = 0;
        return leave(NVML_ERROR_NOT_FOUND);
    }
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    /* `process_util.race = N`: the next N calls with a buffer find one sample more than the sizing
     * call before them did, as when the driver takes a sample between nvidia-ml-py's two calls
     * (nvml.h: the count "may differ from a previously read value"). */
    unsigned int races = 0;
    if (g->s[K_PROC_UTIL_RACE].set && !get_uint(g, K_PROC_UTIL_RACE, &races) && g->races_used < races) {
        g->races_used++;
        *processSamplesCount = n + 1;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int j = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const struct proc *pr = &g->procs[i];
        if (!(pr->util[0] | pr->util[1] | pr->util[2] | pr->util[3]))
            continue;
        utilization[j].pid = pr->pid;
        utilization[j].timeStamp = sample_us;
        utilization[j].smUtil = pr->util[0];
        utilization[j].memUtil = pr->util[1];
        utilization[j].encUtil = pr->util[2];
        utilization[j].decUtil = pr->util[3];
        j++;
    }
    *processSamplesCount = n;
    return leave(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * GPM (GPU Performance Monitoring, Hopper and newer).  A sample records, for every metric the
 * scenario sets on the device, the percent-seconds accumulated so far; nvmlGpmMetricsGet divides
 * the difference of two samples by the time between them, so the answer is the mean over the
 * interval, as on real hardware.  The fake is stricter than the documentation where a client bug
 * would otherwise go unnoticed: two samples of different devices (or of a MIG instance that was
 * re-created in between), or less than 100 ms apart, are refused with INVALID_ARGUMENT.
 */
#define GPM_MAGIC 0x47504d53u
#define GPM_MIN_INTERVAL_S 0.1

struct nvmlGpmSample_st {
    unsigned int magic;
    int filled;
    int gpu, mig;   /* the device sampled; mig is -1 for a whole GPU */
    char uuid[96];  /* of the device sampled, so a re-created MIG instance is told apart */
    double t;
    nvmlReturn_t err[NGPM];
    long double acc[NGPM];
    struct nvmlGpmSample_st *next;
};

static struct nvmlGpmSample_st *gpm_live;

/* For in-process tests: how many samples are allocated and not yet freed. */
int fakeNvmlGpmLiveSamples(void);
int fakeNvmlGpmLiveSamples(void)
{
    pthread_mutex_lock(&lock);
    int n = gpm_live_count;
    pthread_mutex_unlock(&lock);
    return n;
}

static int gpm_valid(nvmlGpmSample_t s)
{
    for (struct nvmlGpmSample_st *x = gpm_live; x; x = x->next)
        if (x == s)
            return s->magic == GPM_MAGIC;
    return 0;
}

nvmlReturn_t DECLDIR nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    if (!gpmSample)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (!s)
        return leave(NVML_ERROR_MEMORY);
    s->magic = GPM_MAGIC;
    s->next = gpm_live;
    gpm_live = s;
    gpm_live_count++;
    *gpmSample = s;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    /* Allowed after nvmlShutdown too, so no enter(): only the lock. */
    pthread_mutex_lock(&lock);
    for (struct nvmlGpmSample_st **pp = &gpm_live; *pp; pp = &(*pp)->next) {
        if (*pp == gpmSample && gpmSample->magic == GPM_MAGIC) {
            *pp = gpmSample->next;
            gpmSample->magic = 0;
            free(gpmSample);
            gpm_live_count--;
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}

/* Whether the GPU behind a (GPU or MIG) handle has GPM.  Called with the lock held. */
static nvmlReturn_t gpm_support(nvmlDevice_t h, unsigned int *supported)
{
    struct dev *d, *g;
    nvmlReturn_t r = resolve(h, &d, &g);
    if (r)
        return r;
    if (reset_required(g))
        return NVML_ERROR_RESET_REQUIRED;
    return get_uint(g, K_GPM_SUPPORTED, supported);
}

nvmlReturn_t DECLDIR nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    struct dev *d;
    if (!gpmSupport)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    unsigned int supported;
    if ((r = gpm_support(device, &supported)))
        return leave(r);
    gpmSupport->isSupportedDevice = supported ? 1 : 0;
    return leave(NVML_SUCCESS);
}

/* Fill `s` from device `d` (handle `h`).  Called with the lock held. */
static nvmlReturn_t gpm_fill(nvmlDevice_t h, const struct dev *d, int mig, nvmlGpmSample_t s)
{
    unsigned int supported = 0;
    nvmlReturn_t r = gpm_support(h, &supported);
    if (r)
        return r;
    if (!supported)
        return NVML_ERROR_NOT_SUPPORTED;
    double now = mono_now();
    s->filled = 1;
    s->gpu = h->gpu;
    s->mig = mig;
    s->t = now;
    snprintf(s->uuid, sizeof s->uuid, "%s", d->s[K_UUID].set && d->s[K_UUID].str ? d->s[K_UUID].str : "");
    for (int i = 0; i < NGPM; i++) {
        const struct slot *sl = &d->s[K_GPM0 + i];
        s->err[i] = !sl->set ? NVML_ERROR_NOT_SUPPORTED : sl->err;
        s->acc[i] = sl->set && !sl->err ? slot_value(sl, now) : 0;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    struct dev *d;
    nvmlReturn_t r = enter_dev(device, &d);
    if (r)
        return r;
    if (!gpm_valid(gpmSample))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* `gpm.parent_in_mig = !NOT_SUPPORTED`: the whole GPU's GPM refused while MIG mode is on (issue
     * 26, point 6; nvml.h only says the call "supports the device handle and MIG device handle"). */
    unsigned int mode = 0;
    const struct slot *q = &d->s[K_GPM_PARENT_IN_MIG];
    if (device->mig < 0 && q->set && q->err && get_uint(d, K_MIG_MODE, &mode) == NVML_SUCCESS && mode)
        return leave(q->err);
    return leave(gpm_fill(device, d, device->mig, gpmSample));
}

nvmlReturn_t DECLDIR nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample)
{
    struct dev *g;
    nvmlReturn_t r = enter_dev(device, &g);
    if (r)
        return r;
    if (!gpm_valid(gpmSample) || device->mig >= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int mode = 0;
    if (get_uint(g, K_MIG_MODE, &mode) != NVML_SUCCESS || !mode)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (int m = 0; m < g->nmig; m++) {
        unsigned int gi;
        if (get_uint(g->mig[m], K_GPU_INSTANCE_ID, &gi) == NVML_SUCCESS && gi == gpuInstanceId)
            return leave(gpm_fill(device, g->mig[m], m, gpmSample));
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t DECLDIR nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    if (!metricsGet)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter();
    if (r)
        return r;
    /* The struct version this "driver" implements: nvml.h's, unless the scenario models another. */
    unsigned int version = NVML_GPM_METRICS_GET_VERSION;
    get_uint(&cur->sys, K_GPM_METRICS_VERSION, &version);
    if (metricsGet->version != version)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const struct nvmlGpmSample_st *a = metricsGet->sample1, *b = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || !gpm_valid(metricsGet->sample1) ||
        !gpm_valid(metricsGet->sample2) || !a->filled || !b->filled)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    double dt = b->t - a->t;
    if (a->gpu != b->gpu || a->mig != b->mig || strcmp(a->uuid, b->uuid) != 0 || (dt < 0 ? -dt : dt) < GPM_MIN_INTERVAL_S)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Only the first numMetrics entries are read or written: the caller's array may be shorter
     * than this header's NVML_GPM_METRIC_MAX (nvidia-ml-py has shipped 98, 210 and 477). */
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        int k = -1;
        for (int j = 0; j < NGPM; j++)
            if (gpm_metrics[j].id == m->metricId)
                k = j;
        if (m->metricId >= NVML_GPM_METRIC_MAX) {
            m->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        } else if (k < 0) {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (a->err[k] || b->err[k]) {
            m->nvmlReturn = a->err[k] ? a->err[k] : b->err[k];
        } else {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = (double)((b->acc[k] - a->acc[k]) / (long double)dt);
            m->metricInfo.shortName = (char *)gpm_metrics[k].key;
            m->metricInfo.longName = (char *)gpm_metrics[k].key;
            m->metricInfo.unit = (char *)gpm_metrics[k].unit;
        }
    }
    return leave(NVML_SUCCESS);
}
