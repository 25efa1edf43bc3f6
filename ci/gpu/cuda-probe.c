/*
 * cuda-probe: does the NVIDIA driver bound into a kubeslot node root work?
 * Run inside the node's tree (ci/gpu/node-root-check.sh runs it in a chroot
 * after kubeslot-nvidia-setup linked the host's driver there). It loads the
 * driver's libraries by soname, as CUDA programs do, through the node's
 * loader cache: libnvidia-ml.so.1 (NVML) and libcuda.so.1 (the CUDA driver
 * API). No CUDA headers or toolkit: the few types and entry points are
 * declared here, as the driver's ABI fixes them.
 *
 * Steps, one line each ("ok STEP: ..." or "FAIL STEP: ..."):
 *   nvml      NVML init, driver version, device count and names
 *   cuda      cuInit, device count, name of device 0
 *   context   a context on device 0
 *   memory    two buffers of N 32-bit words on the device
 *   copy      N words written to the device and read back unchanged
 *   kernel    a PTX kernel JIT-compiled by the driver and launched over N
 *             elements (out[i] = in[i] * 3 + i), every result checked
 * Exit status: 0 every step passed, 1 a step failed (named on stderr).
 *
 *   cc -O2 -Wall -Wextra -Werror -o cuda-probe cuda-probe.c -ldl
 *   cuda-probe [N]      (N elements, default 16777216: 64 MiB per buffer)
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult; /* 0 is CUDA_SUCCESS */
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr; /* 64-bit on every 64-bit host */
typedef int nvmlReturn_t;               /* 0 is NVML_SUCCESS */
typedef void *nvmlDevice_t;

static const char PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry kubeslot_probe(\n"
    "    .param .u64 p_in,\n"
    "    .param .u64 p_out,\n"
    "    .param .u32 p_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<9>;\n"
    "    .reg .b64 %rd<8>;\n"
    "    ld.param.u64 %rd1, [p_in];\n"
    "    ld.param.u64 %rd2, [p_out];\n"
    "    ld.param.u32 %r1, [p_n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p1, %r5, %r1;\n"
    "    @%p1 bra DONE;\n"
    "    cvta.to.global.u64 %rd3, %rd1;\n"
    "    cvta.to.global.u64 %rd4, %rd2;\n"
    "    mul.wide.u32 %rd5, %r5, 4;\n"
    "    add.s64 %rd6, %rd3, %rd5;\n"
    "    ld.global.u32 %r6, [%rd6];\n"
    "    mul.lo.u32 %r7, %r6, 3;\n"
    "    add.u32 %r8, %r7, %r5;\n"
    "    add.s64 %rd7, %rd4, %rd5;\n"
    "    st.global.u32 [%rd7], %r8;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

static void fail(const char *step, const char *what) {
    fprintf(stderr, "FAIL %s: %s\n", step, what);
    exit(1);
}

/* dlsym or fail naming the library and the symbol */
static void *sym(void *lib, const char *libname, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s has no %s", libname, name);
        fail("load", msg);
    }
    return p;
}

static void *load(const char *soname) {
    void *lib = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        char msg[512];
        snprintf(msg, sizeof msg, "dlopen %s: %s", soname, dlerror());
        fail("load", msg);
    }
    return lib;
}

/* the CUDA error's name, when the driver can say it */
static CUresult (*cuGetErrorName_)(CUresult, const char **);

static void check_cu(const char *step, const char *call, CUresult r) {
    if (r == 0)
        return;
    const char *name = "?";
    if (cuGetErrorName_)
        cuGetErrorName_(r, &name);
    char msg[256];
    snprintf(msg, sizeof msg, "%s returned %d (%s)", call, r, name ? name : "?");
    fail(step, msg);
}

static void check_nvml(const char *call, nvmlReturn_t r) {
    if (r == 0)
        return;
    char msg[128];
    snprintf(msg, sizeof msg, "%s returned %d", call, r);
    fail("nvml", msg);
}

int main(int argc, char **argv) {
    unsigned int n = 16u * 1024 * 1024;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each step's line before a FAIL line */
    if (argc > 1) {
        char *end;
        unsigned long v = strtoul(argv[1], &end, 10);
        if (*end || v == 0 || v > (1ul << 28))
            fail("usage", "N must be a number of elements from 1 to 268435456");
        n = (unsigned int)v;
    }

    /* ---- NVML */
    void *nvml = load("libnvidia-ml.so.1");
    nvmlReturn_t (*nvmlInit)(void) = (nvmlReturn_t (*)(void))sym(nvml, "libnvidia-ml.so.1", "nvmlInit_v2");
    nvmlReturn_t (*nvmlSystemGetDriverVersion)(char *, unsigned int) =
        (nvmlReturn_t (*)(char *, unsigned int))sym(nvml, "libnvidia-ml.so.1", "nvmlSystemGetDriverVersion");
    nvmlReturn_t (*nvmlDeviceGetCount)(unsigned int *) =
        (nvmlReturn_t (*)(unsigned int *))sym(nvml, "libnvidia-ml.so.1", "nvmlDeviceGetCount_v2");
    nvmlReturn_t (*nvmlDeviceGetHandleByIndex)(unsigned int, nvmlDevice_t *) =
        (nvmlReturn_t (*)(unsigned int, nvmlDevice_t *))sym(nvml, "libnvidia-ml.so.1", "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*nvmlDeviceGetName)(nvmlDevice_t, char *, unsigned int) =
        (nvmlReturn_t (*)(nvmlDevice_t, char *, unsigned int))sym(nvml, "libnvidia-ml.so.1", "nvmlDeviceGetName");
    nvmlReturn_t (*nvmlShutdown)(void) = (nvmlReturn_t (*)(void))sym(nvml, "libnvidia-ml.so.1", "nvmlShutdown");

    check_nvml("nvmlInit_v2", nvmlInit());
    char version[96] = "";
    check_nvml("nvmlSystemGetDriverVersion", nvmlSystemGetDriverVersion(version, sizeof version));
    unsigned int count = 0;
    check_nvml("nvmlDeviceGetCount_v2", nvmlDeviceGetCount(&count));
    if (count == 0)
        fail("nvml", "NVML sees no GPU");
    printf("ok nvml: driver %s, %u GPU(s)", version, count);
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        char name[96] = "";
        check_nvml("nvmlDeviceGetHandleByIndex_v2", nvmlDeviceGetHandleByIndex(i, &dev));
        check_nvml("nvmlDeviceGetName", nvmlDeviceGetName(dev, name, sizeof name));
        printf("%s %u: %s", i ? "," : ":", i, name);
    }
    printf("\n");
    check_nvml("nvmlShutdown", nvmlShutdown());

    /* ---- CUDA driver API */
    void *cuda = load("libcuda.so.1");
    const char *L = "libcuda.so.1";
    cuGetErrorName_ = (CUresult (*)(CUresult, const char **))dlsym(cuda, "cuGetErrorName");
    CUresult (*cuInit)(unsigned int) = (CUresult (*)(unsigned int))sym(cuda, L, "cuInit");
    CUresult (*cuDriverGetVersion)(int *) = (CUresult (*)(int *))sym(cuda, L, "cuDriverGetVersion");
    CUresult (*cuDeviceGetCount)(int *) = (CUresult (*)(int *))sym(cuda, L, "cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = (CUresult (*)(CUdevice *, int))sym(cuda, L, "cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) =
        (CUresult (*)(char *, int, CUdevice))sym(cuda, L, "cuDeviceGetName");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice) =
        (CUresult (*)(CUcontext *, unsigned int, CUdevice))sym(cuda, L, "cuCtxCreate_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = (CUresult (*)(CUcontext))sym(cuda, L, "cuCtxDestroy_v2");
    CUresult (*cuCtxSynchronize)(void) = (CUresult (*)(void))sym(cuda, L, "cuCtxSynchronize");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))sym(cuda, L, "cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))sym(cuda, L, "cuMemFree_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) =
        (CUresult (*)(CUdeviceptr, const void *, size_t))sym(cuda, L, "cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) =
        (CUresult (*)(void *, CUdeviceptr, size_t))sym(cuda, L, "cuMemcpyDtoH_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) =
        (CUresult (*)(CUmodule *, const void *))sym(cuda, L, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        (CUresult (*)(CUfunction *, CUmodule, const char *))sym(cuda, L, "cuModuleGetFunction");
    CUresult (*cuModuleUnload)(CUmodule) = (CUresult (*)(CUmodule))sym(cuda, L, "cuModuleUnload");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                               unsigned int, unsigned int, CUstream, void **, void **) =
        (CUresult (*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                      unsigned int, CUstream, void **, void **))sym(cuda, L, "cuLaunchKernel");

    check_cu("cuda", "cuInit", cuInit(0));
    int driver = 0, devices = 0;
    check_cu("cuda", "cuDriverGetVersion", cuDriverGetVersion(&driver));
    check_cu("cuda", "cuDeviceGetCount", cuDeviceGetCount(&devices));
    if (devices == 0)
        fail("cuda", "CUDA sees no device");
    CUdevice dev;
    char name[96] = "";
    check_cu("cuda", "cuDeviceGet", cuDeviceGet(&dev, 0));
    check_cu("cuda", "cuDeviceGetName", cuDeviceGetName(name, sizeof name, dev));
    printf("ok cuda: CUDA %d.%d driver API, %d device(s), device 0: %s\n", driver / 1000, (driver % 1000) / 10,
           devices, name);

    CUcontext ctx;
    check_cu("context", "cuCtxCreate_v2", cuCtxCreate(&ctx, 0, dev));
    printf("ok context: on device 0\n");

    size_t bytes = (size_t)n * sizeof(uint32_t);
    uint32_t *in = malloc(bytes), *back = malloc(bytes);
    if (!in || !back)
        fail("memory", "host allocation failed");
    CUdeviceptr d_in, d_out;
    check_cu("memory", "cuMemAlloc_v2", cuMemAlloc(&d_in, bytes));
    check_cu("memory", "cuMemAlloc_v2", cuMemAlloc(&d_out, bytes));
    printf("ok memory: 2 x %zu bytes on the device\n", bytes);

    for (unsigned int i = 0; i < n; i++)
        in[i] = i * 2654435761u; /* every word different, no pattern a stuck bit hides in */
    memset(back, 0, bytes);
    check_cu("copy", "cuMemcpyHtoD_v2", cuMemcpyHtoD(d_in, in, bytes));
    check_cu("copy", "cuMemcpyDtoH_v2", cuMemcpyDtoH(back, d_in, bytes));
    for (unsigned int i = 0; i < n; i++) {
        if (back[i] != in[i]) {
            char msg[128];
            snprintf(msg, sizeof msg, "word %u read back as 0x%08x, written 0x%08x", i, back[i], in[i]);
            fail("copy", msg);
        }
    }
    printf("ok copy: %zu bytes written and read back unchanged\n", bytes);

    CUmodule mod;
    CUfunction fn;
    check_cu("kernel", "cuModuleLoadData (PTX JIT)", cuModuleLoadData(&mod, PTX));
    check_cu("kernel", "cuModuleGetFunction", cuModuleGetFunction(&fn, mod, "kubeslot_probe"));
    unsigned int threads = 256, blocks = (n + threads - 1) / threads;
    void *args[] = {&d_in, &d_out, &n};
    check_cu("kernel", "cuLaunchKernel", cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, args, NULL));
    check_cu("kernel", "cuCtxSynchronize", cuCtxSynchronize());
    memset(back, 0, bytes);
    check_cu("kernel", "cuMemcpyDtoH_v2", cuMemcpyDtoH(back, d_out, bytes));
    for (unsigned int i = 0; i < n; i++) {
        uint32_t want = in[i] * 3u + i;
        if (back[i] != want) {
            char msg[128];
            snprintf(msg, sizeof msg, "element %u is 0x%08x, not 0x%08x", i, back[i], want);
            fail("kernel", msg);
        }
    }
    printf("ok kernel: PTX JIT-compiled and launched over %u elements (%u blocks of %u), every result right\n", n,
           blocks, threads);

    check_cu("cleanup", "cuModuleUnload", cuModuleUnload(mod));
    check_cu("cleanup", "cuMemFree_v2", cuMemFree(d_in));
    check_cu("cleanup", "cuMemFree_v2", cuMemFree(d_out));
    check_cu("cleanup", "cuCtxDestroy_v2", cuCtxDestroy(ctx));
    free(in);
    free(back);
    printf("cuda-probe: every step passed\n");
    return 0;
}
