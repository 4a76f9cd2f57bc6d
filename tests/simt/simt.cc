// The CPU stand-in for a GPU (include/cuda_runtime.h): a block's threads are fibers on the calling
// thread, switched only at __syncthreads and warp operations, in thread order. A barrier opens
// when every live thread of the block has reached it; a warp operation completes when all of its
// warp's live lanes have joined it with the same operation. Anything else (a barrier or shuffle
// that part of the block or warp cannot reach) is reported as a failed launch, as a real GPU
// would hang or misbehave there.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda_runtime.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

#if !defined(__x86_64__)
#error "tests/simt switches fibers with x86-64 code"
#endif

// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save and resumes the context whose stack pointer is `load`.
extern "C" void hr_simt_switch(void** save, void* load);
asm(R"(
  .text
  .globl hr_simt_switch
  .type hr_simt_switch, @function
hr_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size hr_simt_switch, .-hr_simt_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace hr::simt {
namespace {

constexpr size_t kStackBytes = 64 << 10;
constexpr int kWarp = 32;

enum class State { kRunnable, kAtBarrier, kAtWarp, kDone };

struct Fiber {
  void* sp = nullptr;
  unsigned tid = 0;
  State state = State::kRunnable;
  WarpOp op = WarpOp::kIdx;
  uint64_t bits = 0;
  int arg = 0;
  uint64_t result = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  void* main_sp = nullptr;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
};

thread_local Block* t_block = nullptr;
thread_local std::string t_error;
thread_local cudaError_t t_last = cudaSuccess;

// Fiber stacks, each with a guard page below it, kept for the next launch.
struct Stacks {
  char* base = nullptr;
  size_t count = 0;
  char* top(size_t i) const { return base + (i + 1) * (kStackBytes + page()); }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  void reserve(size_t n) {
    if (n <= count) return;
    if (base) munmap(base, count * (kStackBytes + page()));
    const size_t bytes = n * (kStackBytes + page());
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("simt: fiber stacks");
      std::abort();
    }
    base = static_cast<char*>(p);
    count = n;
    for (size_t i = 0; i < n; ++i) mprotect(base + i * (kStackBytes + page()), page(), PROT_NONE);
  }
};
thread_local Stacks t_stacks;

[[noreturn]] void fiber_entry() {
  Block* b = t_block;
  (*b->body)();
  b->current->state = State::kDone;
  hr_simt_switch(&b->current->sp, b->main_sp);
  std::abort();  // a finished fiber is never resumed
}

void prepare(Fiber& f, char* top) {
  auto* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15});
  *--sp = 0;                                          // so that fiber_entry starts as if called
  *--sp = reinterpret_cast<uint64_t>(&fiber_entry);   // where the first switch returns to
  for (int r = 0; r < 6; ++r) *--sp = 0;              // rbp rbx r12 r13 r14 r15
  *--sp = 0x037full << 32 | 0x1f80ull;                // MXCSR and x87 control word: the defaults
  f.sp = sp;
}

void yield() {
  Block* b = t_block;
  hr_simt_switch(&b->current->sp, b->main_sp);
}

// Completes a warp's operation once all its live lanes have joined; false while some have not.
bool settle_warp(Fiber* lanes, int n, std::string* error) {
  int joined = 0, done = 0;
  for (int l = 0; l < n; ++l) {
    joined += lanes[l].state == State::kAtWarp;
    done += lanes[l].state == State::kDone;
  }
  if (joined == 0 || joined + done < n) return false;
  if (done > 0) {
    *error = "a warp operation that exited lanes cannot join (warp of thread " + std::to_string(lanes[0].tid) + ")";
    return false;
  }
  for (int l = 1; l < n; ++l) {
    if (lanes[l].op != lanes[0].op) {
      *error = "lanes of one warp at different warp operations (thread " + std::to_string(lanes[l].tid) + ")";
      return false;
    }
  }
  uint64_t ballot = 0;
  for (int l = 0; l < n; ++l) ballot |= (lanes[l].bits & 1) << l;
  for (int l = 0; l < n; ++l) {
    Fiber& f = lanes[l];
    int src = l;
    switch (f.op) {
      case WarpOp::kIdx: src = f.arg & (kWarp - 1); break;
      case WarpOp::kUp: src = l - f.arg >= 0 ? l - f.arg : l; break;
      case WarpOp::kDown: src = l + f.arg < kWarp ? l + f.arg : l; break;
      case WarpOp::kXor: src = l ^ f.arg; break;
      case WarpOp::kBallot: break;
    }
    if (f.op == WarpOp::kBallot) {
      f.result = ballot;
    } else {
      f.result = src < n ? lanes[src].bits : f.bits;
    }
  }
  for (int l = 0; l < n; ++l) lanes[l].state = State::kRunnable;
  return true;
}

// Runs one block to the end; false with `error` set when it cannot go on.
bool run_block(Block& b, std::string* error) {
  const int n = static_cast<int>(b.fibers.size());
  for (;;) {
    bool progress = false;
    for (Fiber& f : b.fibers) {
      if (f.state != State::kRunnable) continue;
      threadIdx = uint3{f.tid % blockDim.x, f.tid / blockDim.x % blockDim.y, f.tid / (blockDim.x * blockDim.y)};
      b.current = &f;
      hr_simt_switch(&b.main_sp, f.sp);
      progress = true;
    }
    for (int w = 0; w < n; w += kWarp) {
      if (settle_warp(&b.fibers[w], std::min(kWarp, n - w), error)) progress = true;
      if (!error->empty()) return false;
    }
    int at_barrier = 0, done = 0;
    for (const Fiber& f : b.fibers) {
      at_barrier += f.state == State::kAtBarrier;
      done += f.state == State::kDone;
    }
    if (done == n) return true;
    if (at_barrier > 0 && at_barrier + done == n) {
      if (done > 0) {
        *error = "__syncthreads that " + std::to_string(done) + " exited threads of the block cannot reach";
        return false;
      }
      for (Fiber& f : b.fibers) f.state = State::kRunnable;
      progress = true;
    }
    if (!progress) {
      *error = "threads of one block wait at different barriers or warp operations";
      return false;
    }
  }
}

// Device memory: each allocation ends at a guard page (within 15 bytes), and a guard page lies
// below its first page.
struct Allocation {
  void* map;
  size_t map_bytes;
};
std::map<void*, Allocation>& allocations() {
  static std::map<void*, Allocation> m;
  return m;
}

}  // namespace

cudaError_t launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, const std::function<void()>& body) {
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    t_error = "bad launch shape";
    return t_last = cudaErrorInvalidValue;
  }
  t_stacks.reserve(threads);
  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  if (dynamic_smem_bytes > 0) {
    t_error = "dynamic shared memory is not emulated";
    return t_last = cudaErrorInvalidValue;
  }
  Block* outer = t_block;
  t_block = &b;
  blockDim = block;
  gridDim = grid;
  std::string error;
  for (unsigned z = 0; z < grid.z && error.empty(); ++z) {
    for (unsigned y = 0; y < grid.y && error.empty(); ++y) {
      for (unsigned x = 0; x < grid.x && error.empty(); ++x) {
        blockIdx = uint3{x, y, z};
        for (size_t i = 0; i < threads; ++i) {
          b.fibers[i] = Fiber{};
          b.fibers[i].tid = static_cast<unsigned>(i);
          prepare(b.fibers[i], t_stacks.top(i));
        }
        if (!run_block(b, &error)) {
          error = "block (" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + "): " + error;
        }
      }
    }
  }
  t_block = outer;
  if (!error.empty()) {
    t_error = error;
    std::fprintf(stderr, "simt: %s\n", error.c_str());
    return t_last = cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

void sync_block() {
  t_block->current->state = State::kAtBarrier;
  yield();
}

uint64_t warp_exchange(WarpOp op, uint64_t bits, int arg) {
  Fiber* f = t_block->current;
  f->state = State::kAtWarp;
  f->op = op;
  f->bits = bits;
  f->arg = arg;
  yield();
  return t_block->current->result;
}

const char* last_error() { return t_error.c_str(); }

}  // namespace hr::simt

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t body = (bytes + 15) / 16 * 16;
  const size_t usable = (body + page - 1) / page * page;
  const size_t map_bytes = usable + 2 * page;
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return cudaErrorMemoryAllocation;
  char* c = static_cast<char*>(map);
  mprotect(c, page, PROT_NONE);
  mprotect(c + page + usable, page, PROT_NONE);
  // As close to the end guard as a 16-byte aligned start allows (cudaMalloc aligns to 256; our
  // kernels need 16), so that a read past the end faults at once.
  char* start = c + page + usable - body;
  *ptr = start;
  hr::simt::allocations()[start] = {map, map_bytes};
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto& m = hr::simt::allocations();
  auto it = m.find(ptr);
  if (it == m.end()) return cudaErrorInvalidValue;
  munmap(it->second.map, it->second.map_bytes);
  m.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes) std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) { return cudaMemset(ptr, value, bytes); }
cudaError_t cudaDeviceSynchronize() {
  const cudaError_t e = hr::simt::t_last;
  hr::simt::t_last = cudaSuccess;
  return e;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaDeviceSynchronize(); }
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return hr::simt::last_error();
  }
  return "unknown error";
}
