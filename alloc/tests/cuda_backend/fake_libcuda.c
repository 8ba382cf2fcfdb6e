/*
 * A stand-in libcuda.so for testing CudaBackend's bookkeeping on machines without a GPU.
 *
 * It implements only the driver entry points the backend uses, with the rules the real driver
 * enforces that the backend relies on (unknown handles and pointers are rejected, unmap must
 * name exactly one mapping, a reservation is freed whole and empty, physical memory is limited)
 * and host memory behind every "device" address: cuMemAlloc returns mmap'd memory, reserved
 * ranges are PROT_NONE until cuMemSetAccess makes mapped pages read-write, so a missing
 * cuMemSetAccess faults like it would on a GPU. It proves nothing about the real driver; the
 * real-GPU tests (ALLOCVIEW_CUDA_TESTS=1) do that.
 *
 * At exit it prints one line, "fakecuda: live ...", with every object still alive, so the test
 * can check that dropping the backend gave everything back.
 *
 * Built by alloc/tests/cuda_backend.rs with `cc -shared -fPIC`.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_CONTEXT = 201,
    INVALID_DEVICE = 101,
    INVALID_HANDLE = 400,
};

/* Physical memory of the fake device. */
#define CAPACITY (1ULL << 30)
/* Recommended granularity: 1 MiB, below the backend's 2 MiB minimum, so it must round up. */
#define GRANULARITY (1ULL << 20)
#define MAX_OBJECTS 4096

struct range { CUdeviceptr va; size_t size; int live; };
struct mapping { CUdeviceptr va; size_t size; CUmemGenericAllocationHandle handle; int live; };
struct handle { size_t size; int live; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static int ctx_refs;
static void *current_ctx;
static unsigned long long used;
static struct range allocs[MAX_OBJECTS];
static struct range reservations[MAX_OBJECTS];
static struct mapping mappings[MAX_OBJECTS];
static struct handle handles[MAX_OBJECTS];
static int streams[MAX_OBJECTS];
static int events[MAX_OBJECTS];
static char ctx_token;

#define LOCKED(body) do { pthread_mutex_lock(&lock); CUresult r_ = (body); pthread_mutex_unlock(&lock); return r_; } while (0)

static int count_live_ranges(struct range *r) {
    int n = 0;
    for (int i = 0; i < MAX_OBJECTS; i++) n += r[i].live;
    return n;
}

__attribute__((destructor)) static void report(void) {
    int maps = 0, hs = 0, ss = 0, es = 0;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        maps += mappings[i].live;
        hs += handles[i].live;
        ss += streams[i];
        es += events[i];
    }
    printf("fakecuda: live allocations %d, reservations %d, mappings %d, handles %d, streams %d, events %d, context refs %d, used %llu\n",
           count_live_ranges(allocs), count_live_ranges(reservations), maps, hs, ss, es, ctx_refs, used);
    fflush(stdout);
}

static CUresult need_ctx(void) {
    if (!initialised) return NOT_INITIALIZED;
    return current_ctx == &ctx_token ? SUCCESS : INVALID_CONTEXT;
}

CUresult cuGetErrorString(CUresult error, const char **str) {
    switch (error) {
    case SUCCESS: *str = "no error"; return SUCCESS;
    case INVALID_VALUE: *str = "invalid argument"; return SUCCESS;
    case OUT_OF_MEMORY: *str = "out of memory"; return SUCCESS;
    case NOT_INITIALIZED: *str = "initialization error"; return SUCCESS;
    case INVALID_CONTEXT: *str = "invalid device context"; return SUCCESS;
    case INVALID_DEVICE: *str = "invalid device ordinal"; return SUCCESS;
    case INVALID_HANDLE: *str = "invalid resource handle"; return SUCCESS;
    default: *str = 0; return INVALID_VALUE;
    }
}

CUresult cuInit(unsigned flags) { (void)flags; initialised = 1; return SUCCESS; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return initialised ? SUCCESS : NOT_INITIALIZED; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *dev = 0;
    return SUCCESS;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    (void)attribute;
    if (dev != 0) return INVALID_DEVICE;
    *value = 1; /* virtual memory management supported (and anything else asked) */
    return SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev != 0) return INVALID_DEVICE;
    LOCKED((ctx_refs++, *ctx = &ctx_token, SUCCESS));
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (dev != 0) return INVALID_DEVICE;
    LOCKED(ctx_refs > 0 ? (ctx_refs--, SUCCESS) : INVALID_CONTEXT);
}
CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx != &ctx_token || ctx_refs == 0) return INVALID_CONTEXT;
    current_ctx = ctx; /* the fake does not track threads: one context, current everywhere */
    return SUCCESS;
}
CUresult cuCtxSynchronize(void) { return need_ctx(); }

static CUresult mem_alloc(CUdeviceptr *ptr, size_t size) {
    CUresult r = need_ctx();
    if (r) return r;
    if (size == 0) return INVALID_VALUE;
    if (used + size > CAPACITY) return OUT_OF_MEMORY;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (!allocs[i].live) {
            void *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return OUT_OF_MEMORY;
            allocs[i] = (struct range){(CUdeviceptr)(uintptr_t)p, size, 1};
            used += size;
            *ptr = allocs[i].va;
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) { LOCKED(mem_alloc(ptr, size)); }

static CUresult mem_free(CUdeviceptr ptr) {
    CUresult r = need_ctx();
    if (r) return r;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (allocs[i].live && allocs[i].va == ptr) {
            munmap((void *)(uintptr_t)ptr, allocs[i].size);
            allocs[i].live = 0;
            used -= allocs[i].size;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) { LOCKED(mem_free(ptr)); }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult r = need_ctx();
    if (r) return r;
    pthread_mutex_lock(&lock);
    *free_bytes = CAPACITY - used;
    *total = CAPACITY;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

/* Streams and events: handles are 1-based slot numbers shifted into pointer-looking values. */
#define HANDLE_BASE 0x10000
static CUresult new_slot(int *table, void **out) {
    CUresult r = need_ctx();
    if (r) return r;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (!table[i]) {
            table[i] = 1;
            *out = (void *)(uintptr_t)(HANDLE_BASE + i * 16);
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
static int slot_of(int *table, void *h) {
    uintptr_t v = (uintptr_t)h;
    if (v < HANDLE_BASE || (v - HANDLE_BASE) % 16) return -1;
    uintptr_t i = (v - HANDLE_BASE) / 16;
    return i < MAX_OBJECTS && table[i] ? (int)i : -1;
}
CUresult cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; LOCKED(new_slot(streams, s)); }
static CUresult free_slot(int *table, void *h) {
    int i = slot_of(table, h);
    if (i < 0) return INVALID_HANDLE;
    table[i] = 0;
    return SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) { LOCKED(free_slot(streams, s)); }
CUresult cuEventCreate(CUevent *e, unsigned flags) {
    if (!(flags & 2)) return INVALID_VALUE; /* the backend always disables timing */
    LOCKED(new_slot(events, e));
}
CUresult cuEventDestroy_v2(CUevent e) { LOCKED(free_slot(events, e)); }
static CUresult event_record(CUevent e, CUstream s) {
    CUresult r = need_ctx();
    if (r) return r;
    if (slot_of(events, e) < 0) return INVALID_HANDLE;
    if (s != 0 && slot_of(streams, s) < 0) return INVALID_HANDLE;
    return SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) { LOCKED(event_record(e, s)); }
CUresult cuEventQuery(CUevent e) { LOCKED(slot_of(events, e) < 0 ? INVALID_HANDLE : SUCCESS); }
CUresult cuEventSynchronize(CUevent e) { LOCKED(slot_of(events, e) < 0 ? INVALID_HANDLE : SUCCESS); }

/* Virtual memory. */
CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
    (void)prop;
    *g = option == 1 ? GRANULARITY : GRANULARITY / 2;
    return SUCCESS;
}

static CUresult address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment) {
    if (size == 0 || size % GRANULARITY) return INVALID_VALUE;
    if (alignment == 0) alignment = GRANULARITY;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (!reservations[i].live) {
            void *p = mmap(0, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return OUT_OF_MEMORY;
            uintptr_t aligned = ((uintptr_t)p + alignment - 1) / alignment * alignment;
            /* Trim the slack so the reservation is exactly [aligned, aligned + size). */
            if (aligned > (uintptr_t)p) munmap(p, aligned - (uintptr_t)p);
            uintptr_t end = (uintptr_t)p + size + alignment;
            if (end > aligned + size) munmap((void *)(aligned + size), end - (aligned + size));
            reservations[i] = (struct range){aligned, size, 1};
            *ptr = aligned;
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    (void)addr; (void)flags;
    LOCKED(address_reserve(ptr, size, alignment));
}

static CUresult address_free(CUdeviceptr ptr, size_t size) {
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (reservations[i].live && reservations[i].va == ptr) {
            if (reservations[i].size != size) return INVALID_VALUE;
            for (int m = 0; m < MAX_OBJECTS; m++)
                if (mappings[m].live && mappings[m].va >= ptr && mappings[m].va < ptr + size) return INVALID_VALUE;
            munmap((void *)(uintptr_t)ptr, size);
            reservations[i].live = 0;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { LOCKED(address_free(ptr, size)); }

static CUresult mem_create(CUmemGenericAllocationHandle *h, size_t size) {
    if (size == 0 || size % (GRANULARITY / 2)) return INVALID_VALUE;
    if (used + size > CAPACITY) return OUT_OF_MEMORY;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (!handles[i].live) {
            handles[i] = (struct handle){size, 1};
            used += size;
            *h = (CUmemGenericAllocationHandle)(i + 1);
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const void *prop, unsigned long long flags) {
    (void)prop; (void)flags;
    LOCKED(mem_create(h, size));
}

static int handle_slot(CUmemGenericAllocationHandle h) {
    return h >= 1 && h <= MAX_OBJECTS && handles[h - 1].live ? (int)(h - 1) : -1;
}
static CUresult mem_release(CUmemGenericAllocationHandle h) {
    int i = handle_slot(h);
    if (i < 0) return INVALID_HANDLE;
    for (int m = 0; m < MAX_OBJECTS; m++)
        if (mappings[m].live && mappings[m].handle == h) return INVALID_VALUE; /* stricter than the driver */
    handles[i].live = 0;
    used -= handles[i].size;
    return SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { LOCKED(mem_release(h)); }

static int in_reservation(CUdeviceptr va, size_t size) {
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (reservations[i].live && va >= reservations[i].va && va + size <= reservations[i].va + reservations[i].size) return 1;
    return 0;
}
static CUresult mem_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h) {
    int hi = handle_slot(h);
    if (hi < 0) return INVALID_HANDLE;
    if (offset != 0 || size != handles[hi].size || !in_reservation(va, size)) return INVALID_VALUE;
    int free_slot_index = -1;
    for (int m = 0; m < MAX_OBJECTS; m++) {
        if (mappings[m].live && va < mappings[m].va + mappings[m].size && mappings[m].va < va + size) return INVALID_VALUE;
        if (!mappings[m].live && free_slot_index < 0) free_slot_index = m;
    }
    if (free_slot_index < 0) return OUT_OF_MEMORY;
    mappings[free_slot_index] = (struct mapping){va, size, h, 1};
    return SUCCESS;
}
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    (void)flags;
    LOCKED(mem_map(va, size, offset, h));
}

static CUresult mem_unmap(CUdeviceptr va, size_t size) {
    for (int m = 0; m < MAX_OBJECTS; m++) {
        if (mappings[m].live && mappings[m].va == va) {
            if (mappings[m].size != size) return INVALID_VALUE; /* whole mappings only */
            /* Drop the contents and revoke access, as an unmapped range faults. */
            mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            mappings[m].live = 0;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) { LOCKED(mem_unmap(va, size)); }

struct access_desc { int location_type; int location_id; int flags; };
static CUresult mem_set_access(CUdeviceptr va, size_t size, const struct access_desc *desc, size_t count) {
    if (count != 1 || desc->location_type != 1 || desc->location_id != 0 || desc->flags != 3) return INVALID_VALUE;
    /* Every byte of the range must be mapped. */
    for (CUdeviceptr p = va; p < va + size;) {
        int found = 0;
        for (int m = 0; m < MAX_OBJECTS; m++) {
            if (mappings[m].live && mappings[m].va <= p && p < mappings[m].va + mappings[m].size) {
                p = mappings[m].va + mappings[m].size;
                found = 1;
                break;
            }
        }
        if (!found) return INVALID_VALUE;
    }
    return mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE) == 0 ? SUCCESS : INVALID_VALUE;
}
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const struct access_desc *desc, size_t count) {
    LOCKED(mem_set_access(va, size, desc, count));
}

/* Copies and fills go straight to the host memory behind the addresses. */
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    CUresult r = need_ctx();
    if (r) return r;
    memset((void *)(uintptr_t)dst, value, n);
    return SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CUresult r = need_ctx();
    if (r) return r;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}
