// The CPU stand-in for a GPU (include/cuda_runtime.h): a block's threads are fibers on the calling
// thread, switched only at __syncthreads and warp operations, in thread order. A barrier opens
// when every live thread of the block has reached it; a warp operation completes when all of its
// warp's live lanes have joined it with the same operation. Anything else (a barrier or shuffle
// that part of the block or warp cannot reach) is reported as a failed launch, as a real GPU
// would hang or misbehave there.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

#if !defined(__x86_64__)
#error "simt/ switches fibers with x86-64 code"
#endif

// Save the callee-saved registers on the current stack, store the stack pointer in *save and
// resume the context whose stack pointer is `load`: hr_simt_to_fiber from the scheduler,
// hr_simt_to_main from a fiber. Two copies, each ending in an indirect jump rather than a return
// (a switch never returns to its own caller), so that the branch predictor learns each one's
// usual target: the scheduler's loop, or where the block's fibers wait. (MXCSR and the x87
// control word are not switched: nothing here changes them, and restoring them is slow.)
extern "C" void hr_simt_to_fiber(void** save, void* load);
extern "C" void hr_simt_to_main(void** save, void* load);
#define HR_SIMT_SWITCH(name)             \
  "  .globl " #name                      \
  "\n"                                   \
  "  .type " #name ", @function\n" #name \
  ":\n"                                  \
  "  pushq %rbp\n"                       \
  "  pushq %rbx\n"                       \
  "  pushq %r12\n"                       \
  "  pushq %r13\n"                       \
  "  pushq %r14\n"                       \
  "  pushq %r15\n"                       \
  "  movq %rsp, (%rdi)\n"                \
  "  movq %rsi, %rsp\n"                  \
  "  popq %r15\n"                        \
  "  popq %r14\n"                        \
  "  popq %r13\n"                        \
  "  popq %r12\n"                        \
  "  popq %rbx\n"                        \
  "  popq %rbp\n"                        \
  "  popq %r11\n"                        \
  "  jmpq *%r11\n"                       \
  "  .size " #name ", .-" #name "\n"
asm("  .text\n" HR_SIMT_SWITCH(hr_simt_to_fiber)
        HR_SIMT_SWITCH(hr_simt_to_main) "  .section .note.GNU-stack,\"\",@progbits\n  .text\n");

namespace hr::simt {
namespace {

constexpr size_t kStackBytes = 64 << 10;
constexpr int kWarp = 32;

enum class State { kRunnable, kAtBarrier, kAtWarp, kDone };

// A queued cp.async: 16 bytes from src to dst, or zeros when !valid.
struct AsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};

struct Fiber {
  void* sp = nullptr;
  unsigned tid = 0;
  uint3 idx;  // threadIdx
  State state = State::kRunnable;
  WarpOp op = WarpOp::kIdx;
  uint64_t bits = 0;
  int arg = 0;
  WarpCollective collective = nullptr;
  uint64_t result = 0;
  // Queued cp.async copies, oldest first, and where each committed group ends among them (copies
  // past the last end are not committed yet); `copies_done` have been done.
  std::vector<AsyncCopy> copies;
  std::vector<size_t> group_ends;
  size_t copies_done = 0, groups_done = 0;
  bool waited = false;  // called pdl_wait()

  // Ready to run thread `t` from the top on the stack ending at `top` (keeps the queues' storage).
  void reset(unsigned t, char* top);
};

// Memory that ends at a guard page (device buffers, dynamic shared memory): the mapping, and the
// bytes asked for.
struct Allocation {
  void* map;
  size_t map_bytes;
  size_t bytes;
};

struct Block {
  std::vector<Fiber> fibers;
  void* main_sp = nullptr;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  void* dynamic_smem = nullptr;
  Allocation dynamic_smem_map{};
  size_t dynamic_smem_bytes = 0;
  bool programmatic = false;
};

thread_local Block* t_block = nullptr;
thread_local std::string t_error;
thread_local std::string t_fault;  // the running launch's first fault
thread_local cudaError_t t_last = cudaSuccess;

// Fiber stacks, each with a guard page below it, kept for the next launch.
struct Stacks {
  char* base = nullptr;
  size_t count = 0;
  char* top(size_t i) const { return base + (i + 1) * (kStackBytes + page()); }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  Stacks() = default;
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  ~Stacks() {  // a thread's, as it ends
    if (base) munmap(base, count * (kStackBytes + page()));
  }
  void reserve(size_t n) {
    if (n <= count) return;
    if (base) munmap(base, count * (kStackBytes + page()));
    const size_t bytes = n * (kStackBytes + page());
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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
  if (b->programmatic && !b->current->waited) {
    fault("a thread of a programmatically launched kernel ended without pdl_wait()");
  }
  b->current->state = State::kDone;
  hr_simt_to_main(&b->current->sp, b->main_sp);
  std::abort();  // a finished fiber is never resumed
}

void Fiber::reset(unsigned t, char* top) {
  tid = t;
  idx = uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
  state = State::kRunnable;
  collective = nullptr;
  copies.clear();
  group_ends.clear();
  copies_done = groups_done = 0;
  waited = false;
  auto* s = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15});
  *--s = 0;                                         // so that fiber_entry starts as if called
  *--s = reinterpret_cast<uint64_t>(&fiber_entry);  // where the first switch returns to
  for (int r = 0; r < 6; ++r) *--s = 0;             // rbp rbx r12 r13 r14 r15
  sp = s;
}

void yield() {
  Block* b = t_block;
  hr_simt_to_main(&b->current->sp, b->main_sp);
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
    *error = "a warp operation that exited lanes cannot join (warp of thread " +
             std::to_string(lanes[0].tid) + ")";
    return false;
  }
  for (int l = 1; l < n; ++l) {
    if (lanes[l].op != lanes[0].op || lanes[l].collective != lanes[0].collective) {
      *error = "lanes of one warp at different warp operations (thread " +
               std::to_string(lanes[l].tid) + ")";
      return false;
    }
  }
  if (lanes[0].op == WarpOp::kCollective) {
    if (n != kWarp) {
      *error = "a whole-warp operation in a warp of " + std::to_string(n) + " threads";
      return false;
    }
    void* operands[kWarp];
    for (int l = 0; l < kWarp; ++l) operands[l] = reinterpret_cast<void*>(lanes[l].bits);
    lanes[0].collective(operands);
    for (int l = 0; l < n; ++l) lanes[l].state = State::kRunnable;
    return true;
  }
  uint64_t ballot = 0;
  for (int l = 0; l < n; ++l) ballot |= (lanes[l].bits & 1) << l;
  for (int l = 0; l < n; ++l) {
    Fiber& f = lanes[l];
    int src = l;
    switch (f.op) {
      case WarpOp::kIdx:
        src = f.arg & (kWarp - 1);
        break;
      case WarpOp::kUp:
        src = l - f.arg >= 0 ? l - f.arg : l;
        break;
      case WarpOp::kDown:
        src = l + f.arg < kWarp ? l + f.arg : l;
        break;
      case WarpOp::kXor:
        src = l ^ f.arg;
        break;
      case WarpOp::kBallot:
      case WarpOp::kSync:
      case WarpOp::kCollective:
        break;
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

thread_local int t_reverse = -1;  // set_reverse_order's, or -1: the environment's

bool reverse_order() {
  static const bool from_env = [] {
    const char* v = std::getenv("HEADROOM_SIMT_ORDER");
    return v && std::string(v) == "reverse";
  }();
  return t_reverse < 0 ? from_env : t_reverse == 1;
}

// Runs one block to the end; false with `error` set when it cannot go on.
bool run_block(Block& b, std::string* error) {
  const int n = static_cast<int>(b.fibers.size());
  const bool reverse = reverse_order();
  for (;;) {
    bool progress = false;
    for (int i = 0; i < n; ++i) {
      Fiber& f = b.fibers[reverse ? n - 1 - i : i];
      if (f.state != State::kRunnable) continue;
      threadIdx = f.idx;
      b.current = &f;
      hr_simt_to_fiber(&b.main_sp, f.sp);
      progress = true;
      if (!t_fault.empty()) break;
    }
    for (int w = 0; w < n && t_fault.empty(); w += kWarp) {
      if (settle_warp(&b.fibers[w], std::min(kWarp, n - w), error)) progress = true;
      if (!error->empty()) return false;
    }
    if (!t_fault.empty()) {
      *error = t_fault;
      return false;
    }
    int at_barrier = 0, done = 0;
    for (const Fiber& f : b.fibers) {
      at_barrier += f.state == State::kAtBarrier;
      done += f.state == State::kDone;
    }
    if (done == n) return true;
    if (at_barrier > 0 && at_barrier + done == n) {
      if (done > 0) {
        *error = "__syncthreads that " + std::to_string(done) +
                 " exited threads of the block cannot reach";
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

// Device memory, by its first byte.
std::map<void*, Allocation>& allocations() {
  static std::map<void*, Allocation> m;
  return m;
}

// Defined with the runtime API below.
void* map_guarded(size_t bytes, Allocation* mapping);
void unmap(const Allocation& a);

}  // namespace

cudaError_t launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, bool programmatic,
                   const std::function<void()>& body) {
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    t_error = "bad launch shape";
    return t_last = cudaErrorInvalidValue;
  }
  if (dynamic_smem_bytes > static_cast<size_t>(kMaxSharedMemoryPerBlock)) {
    t_error = "more dynamic shared memory than a block can have";
    return t_last = cudaErrorInvalidValue;
  }
  if (t_block) {  // (the fibers' stacks are in use)
    t_error = "a launch from inside a kernel";
    return t_last = cudaErrorInvalidValue;
  }
  t_stacks.reserve(threads);
  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  // Ends at a guard page, as device buffers do, but is not one of them.
  if (dynamic_smem_bytes > 0 &&
      !(b.dynamic_smem = map_guarded(dynamic_smem_bytes, &b.dynamic_smem_map))) {
    t_error = "dynamic shared memory";
    return t_last = cudaErrorMemoryAllocation;
  }
  b.dynamic_smem_bytes = dynamic_smem_bytes;
  b.programmatic = programmatic;
  t_fault.clear();
  t_block = &b;
  blockDim = block;
  gridDim = grid;
  std::string error;
  for (unsigned z = 0; z < grid.z && error.empty(); ++z) {
    for (unsigned y = 0; y < grid.y && error.empty(); ++y) {
      for (unsigned x = 0; x < grid.x && error.empty(); ++x) {
        blockIdx = uint3{x, y, z};
        if (b.dynamic_smem) std::memset(b.dynamic_smem, 0xFF, dynamic_smem_bytes);
        for (size_t i = 0; i < threads; ++i)
          b.fibers[i].reset(static_cast<unsigned>(i), t_stacks.top(i));
        if (!run_block(b, &error)) {
          error = "block (" + std::to_string(x) + "," + std::to_string(y) + "," +
                  std::to_string(z) + "): " + error;
        }
      }
    }
  }
  t_block = nullptr;
  if (b.dynamic_smem) unmap(b.dynamic_smem_map);
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

void set_reverse_order(bool reverse) { t_reverse = reverse ? 1 : 0; }

void warp_collective(WarpCollective fn, void* mine) {
  Fiber* f = t_block->current;
  f->state = State::kAtWarp;
  f->op = WarpOp::kCollective;
  f->collective = fn;
  f->bits = reinterpret_cast<uint64_t>(mine);
  yield();
  t_block->current->collective = nullptr;
}

void pdl_wait() { t_block->current->waited = true; }

void fault(const char* what) {
  if (t_fault.empty()) t_fault = what;
}

void* dynamic_smem() {
  if (!t_block->dynamic_smem) {
    std::fprintf(stderr, "simt: dynamic shared memory used by a launch that asked for none\n");
    std::abort();
  }
  return t_block->dynamic_smem;
}

namespace {

// Whether [p, p + bytes) lies in the running block's dynamic shared memory (where the kernels keep
// what cp.async fills and ldmatrix reads).
bool in_dynamic_smem(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  const char* base = static_cast<const char*>(t_block->dynamic_smem);
  return base && c >= base && c + bytes <= base + t_block->dynamic_smem_bytes;
}

}  // namespace

void cp_async16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 ||
      (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0)) {
    fault("cp.async of 16 bytes at an address not 16-byte aligned");
    return;
  }
  if (!in_dynamic_smem(dst, 16)) {
    fault("cp.async to outside the block's dynamic shared memory");
    return;
  }
  t_block->current->copies.push_back({dst, src, valid});
}

void cp_async_commit() {
  Fiber* f = t_block->current;
  f->group_ends.push_back(f->copies.size());
}

void cp_async_wait(int pending) {
  Fiber* f = t_block->current;
  while (f->group_ends.size() - f->groups_done > static_cast<size_t>(pending)) {
    for (; f->copies_done < f->group_ends[f->groups_done]; ++f->copies_done) {
      const AsyncCopy& c = f->copies[f->copies_done];
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    ++f->groups_done;
  }
}

namespace {

uint16_t half_of(uint32_t v, int i) {
  return static_cast<uint16_t>(i == 0 ? v & 0xffffu : v >> 16);
}
uint32_t pack(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}
float bf16_bits_to_float(uint16_t h) { return from_bits<float>(static_cast<uint64_t>(h) << 16); }

struct LdmatrixOperands {
  uint32_t* r;
  const void* p;
  bool trans;
};

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the rows of matrix i;
// lane l receives, in register i, row l/4's elements 2(l%4) and 2(l%4)+1 (or, transposed, those
// of column l/4).
void ldmatrix_all(void* const* lanes) {
  const auto* op = static_cast<const LdmatrixOperands* const*>(static_cast<const void*>(lanes));
  for (int l = 0; l < kWarp; ++l) {
    if (reinterpret_cast<uintptr_t>(op[l]->p) % 16 != 0 || op[l]->trans != op[0]->trans) {
      fault("ldmatrix with a row address not 16-byte aligned, or lanes disagreeing on .trans");
      return;
    }
    if (!in_dynamic_smem(op[l]->p, 16)) {
      fault("ldmatrix of a row outside the block's dynamic shared memory");
      return;
    }
  }
  uint16_t m[4][8][8];
  for (int i = 0; i < 4; ++i) {
    for (int row = 0; row < 8; ++row) std::memcpy(m[i][row], op[8 * i + row]->p, 16);
  }
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      op[l]->r[i] = op[0]->trans ? pack(m[i][2 * t][g], m[i][2 * t + 1][g])
                                 : pack(m[i][g][2 * t], m[i][g][2 * t + 1]);
    }
  }
}

struct MmaOperands {
  float* c;
  const uint32_t* a;
  uint32_t b0, b1;
};

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with lane l = 4g + t holding A's rows g and
// g+8 at columns 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3); B's column g at rows 2t, 2t+1 (b0) and
// 2t+8, 2t+9 (b1); C's rows g (c0, c1) and g+8 (c2, c3) at columns 2t, 2t+1.
void mma_all(void* const* lanes) {
  const auto* op = static_cast<const MmaOperands* const*>(static_cast<const void*>(lanes));
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 2; ++e) {
      a[g][2 * t + e] = bf16_bits_to_float(half_of(op[l]->a[0], e));
      a[g + 8][2 * t + e] = bf16_bits_to_float(half_of(op[l]->a[1], e));
      a[g][2 * t + 8 + e] = bf16_bits_to_float(half_of(op[l]->a[2], e));
      a[g + 8][2 * t + 8 + e] = bf16_bits_to_float(half_of(op[l]->a[3], e));
      b[2 * t + e][g] = bf16_bits_to_float(half_of(op[l]->b0, e));
      b[2 * t + 8 + e][g] = bf16_bits_to_float(half_of(op[l]->b1, e));
      c[g][2 * t + e] = op[l]->c[e];
      c[g + 8][2 * t + e] = op[l]->c[2 + e];
    }
  }
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float acc = c[i][j];
      for (int k = 0; k < 16; ++k) acc += a[i][k] * b[k][j];
      c[i][j] = acc;
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 2; ++e) {
      op[l]->c[e] = c[g][2 * t + e];
      op[l]->c[2 + e] = c[g + 8][2 * t + e];
    }
  }
}

}  // namespace

void ldmatrix_x4(uint32_t* r, const void* p, bool trans) {
  LdmatrixOperands mine{r, p, trans};
  warp_collective(&ldmatrix_all, &mine);
}

void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  MmaOperands mine{c, a, b0, b1};
  warp_collective(&mma_all, &mine);
}

// wgmma.mma_async.m64nNk16.f32.bf16.bf16 with both operands K-major in shared memory, 128-byte
// swizzled (the one layout the kernels use: kernels/internal/wgmma.cuh), run at issue: thread t
// of the warpgroup holds, of each 8 columns j, rows 16 (t / 32) + (t % 32) / 4 (d[4j], d[4j + 1])
// and that + 8 (d[4j + 2], d[4j + 3]), at columns 8j + 2 (t % 4) and + 1.
void wgmma_bf16(float* d, int n, uint64_t desc_a, uint64_t desc_b) {
  const char* smem = static_cast<const char*>(dynamic_smem());
  // An operand's start and 8-row stride, read from its descriptor once.
  struct Operand {
    uint32_t start, stride;
  };
  auto operand = [](uint64_t desc) {
    return Operand{static_cast<uint32_t>(desc & 0x3FFF) << 4,
                   static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4};
  };
  if ((desc_a >> 62) != 1 || (desc_b >> 62) != 1) {
    fault("wgmma: only the 128-byte swizzle is emulated");
    return;
  }
  const Operand a = operand(desc_a), b = operand(desc_b);
  // Element (row, k): row's 128 bytes in its 8-row group, the 16-byte chunk swizzled by the
  // address's row bits (the tile is 1 KiB-aligned).
  bool outside = false;
  auto element = [&](const Operand& o, int row, int k) {
    uint32_t addr = o.start + static_cast<uint32_t>(row / 8) * o.stride +
                    static_cast<uint32_t>(row % 8) * 128 + static_cast<uint32_t>(k) * 2;
    addr ^= ((addr >> 7) & 7u) << 4;
    if (!in_dynamic_smem(smem + addr, 2)) {
      outside = true;
      return 0.0f;
    }
    uint16_t bits;
    std::memcpy(&bits, smem + addr, sizeof bits);
    return bf16_bits_to_float(bits);
  };
  const int t = static_cast<int>(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  for (int j = 0; j < n / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0);
      const int col = j * 8 + (lane % 4) * 2 + (e & 1);
      float acc = d[4 * j + e];
      for (int k = 0; k < 16; ++k) acc += element(a, row, k) * element(b, col, k);
      d[4 * j + e] = acc;
    }
  }
  if (outside) fault("wgmma operand outside the block's dynamic shared memory");
}

}  // namespace hr::simt

namespace hr::simt {
namespace {

std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}

// Memory that ends at a guard page (within 15 bytes), with a guard page below its first page too.
void* map_guarded(size_t bytes, Allocation* mapping) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t body = (bytes + 15) / 16 * 16;
  const size_t usable = (body + page - 1) / page * page;
  const size_t map_bytes = usable + 2 * page;
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return nullptr;
  char* c = static_cast<char*>(map);
  mprotect(c, page, PROT_NONE);
  mprotect(c + page + usable, page, PROT_NONE);
  // As close to the end guard as a 16-byte aligned start allows (cudaMalloc aligns to 256; our
  // kernels need 16), so that a read past the end faults at once.
  *mapping = {map, map_bytes, bytes};
  return c + page + usable - body;
}

void unmap(const Allocation& a) { munmap(a.map, a.map_bytes); }

std::atomic<size_t> g_allocated{0};  // by cudaMalloc

}  // namespace

void check_device_range(const void* p, size_t bytes, const char* what) {
  {
    std::lock_guard<std::mutex> lock(state_mutex());
    auto& m = allocations();
    auto it = m.upper_bound(const_cast<void*>(p));
    const char* c = static_cast<const char*>(p);
    if (it != m.begin()) {
      --it;
      const char* start = static_cast<const char*>(it->first);
      if (c >= start && c + bytes <= start + it->second.bytes) return;
    }
  }
  fault((std::string(what) + ": a range outside every device allocation").c_str());
}

namespace {

using Work = std::function<cudaError_t()>;

struct Graph {
  std::vector<Work> work;
};

struct Capture {
  std::thread::id thread;
  Graph* graph = nullptr;
  bool invalidated = false;
  bool blocking = true;  // the stream synchronises with the legacy stream
};

// Streams created with cudaStreamNonBlocking (guarded by state_mutex()).
std::set<cudaStream_t>& non_blocking_streams() {
  static std::set<cudaStream_t> s;
  return s;
}

thread_local int t_device = 0;  // the calling thread's current device (cudaSetDevice)

// Dynamic shared memory limits raised per kernel and device (guarded by state_mutex()): a
// limit is raised on the current device only, as on a GPU.
std::map<std::pair<const void*, int>, int>& smem_limits() {
  static std::map<std::pair<const void*, int>, int> m;
  return m;
}

// Streams being captured (guarded by state_mutex()).
std::map<cudaStream_t, Capture>& captures() {
  static std::map<cudaStream_t, Capture> m;
  return m;
}

// True (and the captures invalidated) when this thread is capturing: for what a capture forbids.
bool forbidden_while_capturing() {
  std::lock_guard<std::mutex> lock(state_mutex());
  bool any = false;
  for (auto& [stream, c] : captures()) {
    if (c.thread == std::this_thread::get_id()) {
      c.invalidated = true;
      any = true;
    }
  }
  return any;
}

cudaError_t sticky_error() {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, Work work) {
  {
    std::lock_guard<std::mutex> lock(state_mutex());
    auto it = captures().find(stream);
    if (it != captures().end()) {
      if (it->second.invalidated) return cudaErrorStreamCaptureInvalidated;
      it->second.graph->work.push_back(std::move(work));
      return cudaSuccess;
    }
  }
  if (stream == nullptr) {
    // Work on the legacy stream waits for every blocking stream: one this thread captures fails.
    std::lock_guard<std::mutex> lock(state_mutex());
    bool implicit = false;
    for (auto& [s, c] : captures()) {
      if (c.thread == std::this_thread::get_id() && c.blocking) c.invalidated = implicit = true;
    }
    if (implicit) return cudaErrorStreamCaptureImplicit;
  }
  return work();
}

void set_dynamic_smem_limit(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> lock(state_mutex());
  smem_limits()[{kernel, t_device}] = bytes;
}

int dynamic_smem_limit(const void* kernel) {
  std::lock_guard<std::mutex> lock(state_mutex());
  auto it = smem_limits().find({kernel, t_device});
  return it == smem_limits().end() ? kDefaultDynamicSmem
                                   : std::max(kDefaultDynamicSmem, it->second);
}

}  // namespace hr::simt

using hr::simt::forbidden_while_capturing;

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  if (bytes > hr::simt::kDeviceMemoryBytes - hr::simt::g_allocated.load())
    return cudaErrorMemoryAllocation;
  hr::simt::Allocation mapping;
  *ptr = hr::simt::map_guarded(bytes, &mapping);
  if (!*ptr) return cudaErrorMemoryAllocation;
  {
    std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
    hr::simt::allocations()[*ptr] = mapping;
  }
  hr::simt::g_allocated += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  hr::simt::Allocation a;
  {
    std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
    auto it = hr::simt::allocations().find(ptr);
    if (it == hr::simt::allocations().end()) return cudaErrorInvalidValue;
    a = it->second;
    hr::simt::allocations().erase(it);
  }
  hr::simt::unmap(a);
  hr::simt::g_allocated -= a.bytes;
  return cudaSuccess;
}

// Synchronous copies and fills wait for the device: they report a failed launch before them.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureImplicit;
  if (cudaError_t e = hr::simt::sticky_error(); e != cudaSuccess) return e;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  return hr::simt::enqueue(stream, [=] {
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
  });
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  return hr::simt::enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
    }
    return cudaSuccess;
  });
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureImplicit;
  if (cudaError_t e = hr::simt::sticky_error(); e != cudaSuccess) return e;
  if (bytes) std::memset(ptr, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return hr::simt::enqueue(stream, [=] {
    if (bytes) std::memset(ptr, value, bytes);
    return cudaSuccess;
  });
}
cudaError_t cudaDeviceSynchronize() {
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  return hr::simt::sticky_error();
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
namespace hr::simt {
namespace {

std::atomic<int> g_devices{0};  // 0: not yet read from the environment

int device_count() {
  int n = g_devices.load();
  if (n > 0) return n;
  const char* e = std::getenv("HEADROOM_SIMT_DEVICES");
  n = e ? std::atoi(e) : 1;
  n = n < 1 ? 1 : n > 64 ? 64 : n;
  int expected = 0;
  g_devices.compare_exchange_strong(expected, n);
  return g_devices.load();
}

bool valid_device(int d) { return d >= 0 && d < device_count(); }

}  // namespace

void set_device_count(int n) { g_devices = n < 1 ? 1 : n > 64 ? 64 : n; }

std::atomic<int> g_compute_major{9};

void set_compute_major(int major) { g_compute_major = major; }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void spin_pause() { std::this_thread::yield(); }

}  // namespace hr::simt

cudaError_t cudaGetDevice(int* device) {
  *device = hr::simt::t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!hr::simt::valid_device(device)) return cudaErrorInvalidDevice;
  hr::simt::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = hr::simt::device_count();
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (!hr::simt::valid_device(device) || !hr::simt::valid_device(peer))
    return cudaErrorInvalidDevice;
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned) {
  if (!hr::simt::valid_device(peer) || peer == hr::simt::t_device) return cudaErrorInvalidDevice;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!hr::simt::valid_device(device)) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CPU stand-in (simt/)", sizeof prop->name - 1);
  prop->major = hr::simt::g_compute_major.load();
  prop->minor = 0;
  prop->totalGlobalMem = hr::simt::kDeviceMemoryBytes;
  prop->multiProcessorCount = hr::simt::kMultiprocessors;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = hr::simt::kMultiprocessors;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = hr::simt::g_compute_major.load();
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = hr::simt::kMaxSharedMemoryPerBlock;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = hr::simt::kDeviceMemoryBytes;
  *free_bytes = hr::simt::kDeviceMemoryBytes - hr::simt::g_allocated.load();
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  if (forbidden_while_capturing()) return cudaErrorStreamCaptureUnsupported;
  *ptr = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

// Streams are names only: distinct handles for the capture bookkeeping.
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  static std::atomic<uintptr_t> next{0};
  *stream = reinterpret_cast<cudaStream_t>(++next);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  cudaStreamCreate(stream);
  if (flags & cudaStreamNonBlocking) {
    std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
    hr::simt::non_blocking_streams().insert(*stream);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
  if (hr::simt::captures().count(stream)) return cudaErrorStreamCaptureUnsupported;
  hr::simt::non_blocking_streams().erase(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr) return cudaErrorStreamCaptureUnsupported;
  std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
  auto [it, added] = hr::simt::captures().try_emplace(stream);
  if (!added) return cudaErrorStreamCaptureUnsupported;
  it->second.thread = std::this_thread::get_id();
  it->second.graph = new hr::simt::Graph();
  it->second.blocking = hr::simt::non_blocking_streams().count(stream) == 0;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
  auto it = hr::simt::captures().find(stream);
  *graph = nullptr;
  if (it == hr::simt::captures().end()) return cudaErrorInvalidValue;
  const hr::simt::Capture c = it->second;
  hr::simt::captures().erase(it);
  if (c.invalidated) {
    delete c.graph;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = reinterpret_cast<cudaGraph_t>(c.graph);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(hr::simt::state_mutex());
  auto it = hr::simt::captures().find(stream);
  *status = it == hr::simt::captures().end() ? cudaStreamCaptureStatusNone
            : it->second.invalidated         ? cudaStreamCaptureStatusInvalidated
                                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new hr::simt::Graph(*reinterpret_cast<hr::simt::Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return cudaErrorInvalidValue;
  const auto* g = reinterpret_cast<const hr::simt::Graph*>(exec);
  return hr::simt::enqueue(stream, [g] {
    for (const hr::simt::Work& w : g->work) {
      if (cudaError_t e = w(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<hr::simt::Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<hr::simt::Graph*>(exec);
  return cudaSuccess;
}

// Events: the host's clock when the stream reached them (at once, as work runs at once).
struct CUevent_st {
  std::chrono::steady_clock::time_point at{};
};
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  return cudaEventCreate(event);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return cudaErrorInvalidResourceHandle;
  return hr::simt::enqueue(stream, [event] {
    event->at = std::chrono::steady_clock::now();
    return cudaSuccess;
  });
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  return cudaDeviceSynchronize();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return hr::simt::sticky_error(); }
namespace {

// Each error's name and text, as the CUDA runtime gives them (a failed launch's text is what
// failed).
struct ErrorText {
  cudaError_t err;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", nullptr},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
};

const ErrorText* error_text(cudaError_t err) {
  for (const ErrorText& e : kErrors) {
    if (e.err == err) return &e;
  }
  return nullptr;
}

}  // namespace

const char* cudaGetErrorName(cudaError_t err) {
  const ErrorText* e = error_text(err);
  return e ? e->name : "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t err) {
  if (err == cudaErrorLaunchFailure) return hr::simt::last_error();
  const ErrorText* e = error_text(err);
  return e ? e->text : "unknown error";
}
