/* A stand-in for libnvidia-ml.so.1 on machines without an NVIDIA driver (CI): the documented C ABI
 * of the eight NVML calls deltaserve uses, reporting two GPUs with fixed, recognisable values.
 * Tests put its directory first on LD_LIBRARY_PATH so the production dlopen() path runs unchanged;
 * on a GPU machine the same tests also run against the real library (label gpu). */
#include <stdio.h>
#include <string.h>

typedef struct FakeDevice* nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

static struct FakeDevice { int index; } devices[2] = {{0}, {1}};
static int initialized = 0;

int nvmlInit_v2(void) { initialized = 1; return 0; }
int nvmlShutdown(void) { initialized = 0; return 0; }
const char* nvmlErrorString(int r) { return r == 0 ? "Success" : "Fake NVML error"; }
int nvmlDeviceGetCount_v2(unsigned int* n) {
  if (!initialized) return 1; /* NVML_ERROR_UNINITIALIZED */
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  if (!initialized) return 1;
  if (i >= 2) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int len) {
  snprintf(name, len, "Fake GPU %d", d->index);
  return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  u->gpu = 37 + (unsigned)d->index; /* 0.37, 0.38 */
  u->memory = 12;
  return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  m->total = 80ull << 30;
  m->used = (3ull << 30) + (unsigned long long)d->index;
  m->free = m->total - m->used;
  return 0;
}
