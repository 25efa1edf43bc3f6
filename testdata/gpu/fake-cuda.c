/*
 * TEST-ONLY: a stand-in for the NVIDIA driver's libnvidia-ml.so.1 and
 * libcuda.so.1, for the CUDA probe's test (ci/gpu/node-root-check-test.sh)
 * on machines without a GPU. The entry points ci/gpu/cuda-probe.c calls,
 * with host memory for device memory; "launching" the probe's kernel
 * computes in C what its PTX computes (out[i] = in[i] * 3 + i), after
 * checking the module is the probe's PTX. What the real driver does with
 * that PTX is only checked on a GPU host (ci/gpu/node-root-check.sh).
 *
 * FAKE_CUDA_BREAK=init|copy|kernel makes cuInit fail, the first read-back
 * flip a bit, or one kernel result wrong: the probe must name that step.
 *
 *   cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 fake-cuda.c
 *   cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake-cuda.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;

static int broken(const char *what) {
    const char *b = getenv("FAKE_CUDA_BREAK");
    return b && strcmp(b, what) == 0;
}

/* ---- NVML */
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    strncpy(v, "0.0-fake", len);
    return 0;
}
int nvmlDeviceGetCount_v2(unsigned int *n) {
    *n = 1;
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
    if (i != 0)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = (void *)1;
    return 0;
}
int nvmlDeviceGetName(void *dev, char *name, unsigned int len) {
    (void)dev;
    strncpy(name, "Fake kubeslot GPU", len);
    return 0;
}

/* ---- CUDA driver API */
int cuGetErrorName(int r, const char **name) {
    *name = r == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_FAKE";
    return 0;
}
int cuInit(unsigned int flags) {
    (void)flags;
    return broken("init") ? 100 : 0;
}
int cuDriverGetVersion(int *v) {
    *v = 12080;
    return 0;
}
int cuDeviceGetCount(int *n) {
    *n = 1;
    return 0;
}
int cuDeviceGet(int *dev, int i) {
    *dev = i;
    return i == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "Fake kubeslot GPU", (size_t)len);
    return 0;
}
int cuCtxCreate_v2(void **ctx, unsigned int flags, int dev) {
    (void)flags;
    (void)dev;
    *ctx = (void *)1;
    return 0;
}
int cuCtxDestroy_v2(void *ctx) {
    (void)ctx;
    return 0;
}
int cuCtxSynchronize(void) { return 0; }
int cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    void *m = malloc(bytes);
    if (!m)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *p = (CUdeviceptr)(uintptr_t)m;
    return 0;
}
int cuMemFree_v2(CUdeviceptr p) {
    free((void *)(uintptr_t)p);
    return 0;
}
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return 0;
}
static int reads;
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (void *)(uintptr_t)src, bytes);
    if (reads++ == 0 && broken("copy") && bytes >= 4)
        ((uint8_t *)dst)[bytes / 2] ^= 0x10;
    return 0;
}
int cuModuleLoadData(void **mod, const void *image) {
    if (!strstr((const char *)image, ".entry kubeslot_probe(") || !strstr((const char *)image, ".version "))
        return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *mod = (void *)1;
    return 0;
}
int cuModuleGetFunction(void **fn, void *mod, const char *name) {
    (void)mod;
    if (strcmp(name, "kubeslot_probe") != 0)
        return 500; /* CUDA_ERROR_NOT_FOUND */
    *fn = (void *)2;
    return 0;
}
int cuModuleUnload(void *mod) {
    (void)mod;
    return 0;
}
int cuLaunchKernel(void *fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int shared, void *stream, void **args, void **extra) {
    (void)fn;
    (void)shared;
    (void)stream;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || extra)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    const uint32_t *in = (const uint32_t *)(uintptr_t) * (CUdeviceptr *)args[0];
    uint32_t *out = (uint32_t *)(uintptr_t) * (CUdeviceptr *)args[1];
    uint32_t n = *(uint32_t *)args[2];
    for (uint64_t i = 0; i < (uint64_t)gx * bx && i < n; i++)
        out[i] = in[i] * 3u + (uint32_t)i;
    if (broken("kernel") && n > 0)
        out[n - 1] ^= 1;
    return 0;
}
