// A host stand-in for the parts of the CUDA runtime and device intrinsics that our kernels use, so
// that their sources compile as C++ and run on the CPU (simt/simt.cc): each block in turn,
// each thread a fiber, shared memory shared by the block's fibers, warp shuffles, votes and
// __syncwarp exchanged among a warp's 32 fibers, __syncthreads a barrier that every live thread of
// the block must reach. Device memory is host memory that ends at a guard page, so a read past a
// buffer faults; dynamic shared memory (HR_DYNAMIC_SMEM) is a per-block buffer ending at one too,
// filled with 0xFF bytes (NaN as floats) before each block; more than 48 KiB of it needs the
// kernel's limit raised first, as on a GPU. The PTX the kernels use has stand-ins behind their
// wrappers (kernels/internal/mma.cuh, common.cuh): ldmatrix and mma.sync are whole-warp
// operations on the warp's fragments (rows in the block's dynamic shared memory); cp.async copies
// into it are queued per thread and done only when a cp.async.wait_group lets their group
// complete, so a read before the wait sees the poison; L2 prefetches fail unless their range lies
// inside one device allocation (in 16-byte pieces for the bulk one). Races show only where one of
// the two thread orders (set_reverse_order) exposes them: fibers switch only at barriers and warp
// operations. Programmatic dependent launch is not emulated (kernels run one after another).
// Several devices may be simulated (set_device_count), sharing one memory; a kernel runs on the
// thread that launches it, so kernels launched from several threads run at once.
// Floating-point intrinsics are the host's IEEE operations (__expf is expf, not the GPU's
// approximation); mma.sync sums in fp32 in k order. Launch errors are sticky until a synchronise,
// a synchronous copy or cudaGetLastError reports them (and then cleared, unlike a GPU's).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorMisalignedAddress = 716,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorNotSupported = 801,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
union cudaLaunchAttributeValue {
  int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes = 0;
  cudaStream_t stream = nullptr;
  cudaLaunchAttribute* attrs = nullptr;
  unsigned numAttrs = 0;
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
  int multiProcessorCount;
};
struct cudaFuncAttributes {
  int ptxVersion = 0;
  int binaryVersion = 0;
  int maxThreadsPerBlock = 1024;
};

// The current thread's and block's coordinates, set by the scheduler before it resumes a fiber.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

namespace hr::simt {

enum class WarpOp { kIdx, kUp, kDown, kXor, kBallot, kSync, kCollective };

// The stand-in's device: an H100's multiprocessor count and shared memory per block.
constexpr int kMultiprocessors = 132;
constexpr int kMaxSharedMemoryPerBlock = 227 << 10;
constexpr int kBlocksPerMultiprocessor = 8;
constexpr size_t kDeviceMemoryBytes = size_t{80} << 30;

// Runs body() for every thread of every block of the grid, with `dynamic_smem` bytes of dynamic
// shared memory per block; fails (with last_error()) on a barrier some live thread cannot reach, a
// warp operation some lane cannot join, or a fault. Not from inside a kernel. A `programmatic`
// launch (programmatic stream serialisation) fails when a thread ends without having called
// pdl_wait(): kernels/launch.cuh's rule that every kernel waits for the one before it before it
// touches what that one writes (a kernel that never waits would race with it on a GPU).
cudaError_t launch(dim3 grid, dim3 block, size_t dynamic_smem, bool programmatic,
                   const std::function<void()>& body);
// griddepcontrol.wait (kernels/internal/common.cuh's pdl_wait): here the previous kernel is done.
void pdl_wait();
// Streams and graphs: work runs at once, in the order it is issued, except on a stream being
// captured, where it is recorded into the graph instead (and runs at each launch of the graph).
// While this thread captures, what a capture forbids (synchronising, a synchronous copy, an
// allocation, work on the legacy stream while a blocking stream is captured) fails and invalidates
// the capture.
cudaError_t enqueue(cudaStream_t stream, std::function<cudaError_t()> work);
void sync_block();
// This lane's contribution to a warp-wide operation, and what it gets back.
uint64_t warp_exchange(WarpOp op, uint64_t bits, int arg);
const char* last_error();
// Fibers run from the last thread to the first (else first to last) between switches. A thread
// that reads what another writes with no barrier between sees it in one order and not in the
// other, so a test run in both orders shows such a race as a wrong result in one of them. The
// default is HEADROOM_SIMT_ORDER (reverse, or anything else for forward); this sets it for the
// calling thread.
void set_reverse_order(bool reverse);
// A warp operation on more than a value per lane: every lane passes a pointer to its operands, and
// once the whole warp (32 lanes) has joined with the same fn, fn(lanes) runs once, lanes[l] being
// lane l's pointer.
using WarpCollective = void (*)(void* const* lanes);
void warp_collective(WarpCollective fn, void* mine);
// Fails the running launch with `what` (the first failure is the one reported).
void fault(const char* what);
// A monotonic clock (the GPU's %globaltimer), and a pause for a thread that waits on a flag
// another host thread (another device's kernel) raises.
int64_t now_ns();
void spin_pause();
// The devices the stand-in has (cudaGetDeviceCount; 1 unless set, or HEADROOM_SIMT_DEVICES):
// each thread has its current device (cudaSetDevice), all of them share one memory, and every
// device reaches every other's (peer access). Their kernels run on the threads that launch them,
// so ranks on threads of their own run at once.
void set_device_count(int n);
// The compute capability's major number every device reports (9: Hopper, whose code the kernels
// are built as; another, to see what a build does on other GPUs).
void set_compute_major(int major);
// The running block's dynamic shared memory.
void* dynamic_smem();
// Faults unless [p, p + bytes) lies inside one device allocation.
void check_device_range(const void* p, size_t bytes, const char* what);
// The PTX the kernels use (kernels/internal/mma.cuh).
void cp_async16(void* dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int pending);
void ldmatrix_x4(uint32_t* r, const void* p, bool trans);
void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
// wgmma.mma_async.m64nNk16 (bf16, fp32 accumulators) over shared-memory descriptors: this
// thread's share of d (n / 2 values) (kernels/internal/wgmma.cuh).
void wgmma_bf16(float* d, int n, uint64_t desc_a, uint64_t desc_b);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace hr::simt

// Dynamic shared memory (kernels/internal/common.cuh declares it through this macro).
// (16-byte aligned, whatever the kernel asks: the buffer ends at a guard page.)
#define HR_DYNAMIC_SMEM(type, name, align) \
  type* name = static_cast<type*>(::hr::simt::dynamic_smem())

// Runtime API.
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
template <typename F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F*, int, size_t) {
  *blocks = hr::simt::kBlocksPerMultiprocessor;
  return cudaSuccess;
}
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t err);
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F*) {
  *a = cudaFuncAttributes{};
  a->ptxVersion = 90;  // as the kernels' sm_90 code: programmatic launch supported
  return cudaSuccess;
}
namespace hr::simt {
// The dynamic shared memory a kernel may ask for: 48 KiB unless raised (cudaFuncSetAttribute).
constexpr int kDefaultDynamicSmem = 48 << 10;
void set_dynamic_smem_limit(const void* kernel, int bytes);
int dynamic_smem_limit(const void* kernel);
}  // namespace hr::simt
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > hr::simt::kMaxSharedMemoryPerBlock) {
    return cudaErrorInvalidValue;
  }
  hr::simt::set_dynamic_smem_limit(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*kernel)(Params...),
                               Args&&... args) {
  // The parameters copied, as a launch (or a graph's kernel node) copies them.
  std::tuple<std::remove_cvref_t<Params>...> params(static_cast<Params>(args)...);
  const dim3 grid = cfg->gridDim, block = cfg->blockDim;
  const size_t smem = cfg->dynamicSmemBytes;
  if (smem >
      static_cast<size_t>(hr::simt::dynamic_smem_limit(reinterpret_cast<const void*>(kernel)))) {
    return cudaErrorInvalidValue;  // more than 48 KiB without raising the kernel's limit first
  }
  bool programmatic = false;
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    programmatic |= cfg->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization &&
                    cfg->attrs[i].val.programmaticStreamSerializationAllowed != 0;
  }
  return hr::simt::enqueue(cfg->stream, [kernel, params, grid, block, smem, programmatic] {
    return hr::simt::launch(grid, block, smem, programmatic, [&] { std::apply(kernel, params); });
  });
}

// Events, streams, graphs, pinned memory, the device.
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
const char* cudaGetErrorName(cudaError_t err);

// Synchronisation and warp intrinsics (full warps only: every lane of the warp takes part).
inline void __syncthreads() { hr::simt::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  hr::simt::warp_exchange(hr::simt::WarpOp::kSync, 0, 0);
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T>
T __shfl_sync(unsigned, T v, int src, int = 32) {
  return hr::simt::from_bits<T>(
      hr::simt::warp_exchange(hr::simt::WarpOp::kIdx, hr::simt::to_bits(v), src));
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int = 32) {
  return hr::simt::from_bits<T>(hr::simt::warp_exchange(hr::simt::WarpOp::kUp, hr::simt::to_bits(v),
                                                        static_cast<int>(delta)));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
  return hr::simt::from_bits<T>(hr::simt::warp_exchange(
      hr::simt::WarpOp::kDown, hr::simt::to_bits(v), static_cast<int>(delta)));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
  return hr::simt::from_bits<T>(
      hr::simt::warp_exchange(hr::simt::WarpOp::kXor, hr::simt::to_bits(v), lane_mask));
}
inline unsigned __ballot_sync(unsigned, int pred) {
  return static_cast<unsigned>(
      hr::simt::warp_exchange(hr::simt::WarpOp::kBallot, pred != 0 ? 1 : 0, 0));
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }

// Atomics: fibers switch only at barriers and warp operations, so plain updates are atomic.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

// Loads with cache hints.
template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
template <typename T>
T __ldcs(const T* p) {
  return *p;
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// Integer and floating-point intrinsics.
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline unsigned __float_as_uint(float f) {
  return hr::simt::from_bits<unsigned>(hr::simt::to_bits(f));
}
inline float __uint_as_float(unsigned u) { return hr::simt::from_bits<float>(u); }
inline int __float_as_int(float f) { return hr::simt::from_bits<int>(hr::simt::to_bits(f)); }
inline float __int_as_float(int i) { return hr::simt::from_bits<float>(static_cast<uint32_t>(i)); }
using std::isfinite;
using std::isinf;
using std::isnan;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
