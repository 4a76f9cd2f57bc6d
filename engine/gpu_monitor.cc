// NVML through dlopen: only the handful of entry points the worker reads, declared here with
// NVML's documented C types.
#include "engine/gpu_monitor.h"

#include <dlfcn.h>

namespace hr::engine {
namespace {

using nvmlReturn = int;  // NVML_SUCCESS == 0
using nvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct GpuMonitor::Api {
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  nvmlReturn (*device_count)(unsigned int*) = nullptr;
  nvmlReturn (*handle_by_index)(unsigned int, nvmlDevice*) = nullptr;
  nvmlReturn (*utilization)(nvmlDevice, NvmlUtilization*) = nullptr;
  nvmlReturn (*memory)(nvmlDevice, NvmlMemory*) = nullptr;
  const char* (*error_string)(nvmlReturn) = nullptr;
};

Result<std::unique_ptr<GpuMonitor>> GpuMonitor::open() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return unavailable("NVML is not available (no NVIDIA driver): " + std::string(dlerror()));
  std::unique_ptr<GpuMonitor> m(new GpuMonitor());
  m->lib_ = lib;
  m->api_ = std::make_unique<Api>();
  Api& a = *m->api_;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  if (!sym(a.init, "nvmlInit_v2") || !sym(a.shutdown, "nvmlShutdown") ||
      !sym(a.device_count, "nvmlDeviceGetCount_v2") ||
      !sym(a.handle_by_index, "nvmlDeviceGetHandleByIndex_v2") ||
      !sym(a.utilization, "nvmlDeviceGetUtilizationRates") ||
      !sym(a.memory, "nvmlDeviceGetMemoryInfo") || !sym(a.error_string, "nvmlErrorString")) {
    a.init = nullptr;  // not initialised: nothing to shut down
    return unavailable("libnvidia-ml lacks an expected entry point");
  }
  if (nvmlReturn r = a.init(); r != 0) {
    a.init = nullptr;
    return unavailable(std::string("nvmlInit failed: ") + a.error_string(r));
  }
  unsigned int n = 0;
  if (nvmlReturn r = a.device_count(&n); r != 0) {
    return unavailable(std::string("nvmlDeviceGetCount failed: ") + a.error_string(r));
  }
  m->num_devices_ = static_cast<int>(n);
  return m;
}

GpuMonitor::~GpuMonitor() {
  if (api_ && api_->init && api_->shutdown) api_->shutdown();
  if (lib_) dlclose(lib_);
}

Result<GpuReading> GpuMonitor::read(int index) const {
  if (index < 0 || index >= num_devices_) {
    return invalid_argument(
        "no GPU " + std::to_string(index) + " (NVML sees " + std::to_string(num_devices_) + ")",
        "device");
  }
  nvmlDevice dev = nullptr;
  if (nvmlReturn r = api_->handle_by_index(static_cast<unsigned int>(index), &dev); r != 0) {
    return unavailable(std::string("nvmlDeviceGetHandleByIndex: ") + api_->error_string(r));
  }
  NvmlUtilization u{};
  NvmlMemory mem{};
  if (nvmlReturn r = api_->utilization(dev, &u); r != 0) {
    return unavailable(std::string("nvmlDeviceGetUtilizationRates: ") + api_->error_string(r));
  }
  if (nvmlReturn r = api_->memory(dev, &mem); r != 0) {
    return unavailable(std::string("nvmlDeviceGetMemoryInfo: ") + api_->error_string(r));
  }
  GpuReading g;
  g.utilization_percent = static_cast<int>(u.gpu);
  g.memory_utilization_percent = static_cast<int>(u.memory);
  g.memory_used_bytes = mem.used;
  g.memory_total_bytes = mem.total;
  return g;
}

}  // namespace hr::engine
