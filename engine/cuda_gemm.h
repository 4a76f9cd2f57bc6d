// bf16 GEMMs through cuBLASLt for the CUDA backend: y[m, n] = x[m, k] · w[n, k]^T (row-major, the
// layout of activations and of Hugging Face weight matrices), fp32 accumulation, fp32 or bf16
// output. The heuristic's algorithm is cached per (m, n, k, output type). Not thread-safe: one per
// backend stream.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "base/status.h"

namespace hr::engine {

enum class GemmOut { kF32, kBF16 };

class CublasLtGemm {
 public:
  [[nodiscard]] static Result<std::unique_ptr<CublasLtGemm>> create(size_t workspace_bytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Chooses (and caches) the algorithm for the shape. A stream being captured into a graph runs
  // only shapes prepared before: choosing one is not done during a capture.
  [[nodiscard]] Status prepare(int m, int n, int k, GemmOut out) {
    return plan(m, n, k, out).status();
  }

  // x: [m, k] bf16; w: [n, k] bf16; y: [m, n] (fp32 or bf16 per `out`). Enqueued on `stream`.
  [[nodiscard]] Status run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, GemmOut out,
                           int m, int n, int k, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  CublasLtGemm() = default;
  // The cached plan for the shape, built on first use: not while `stream` is being captured.
  Result<const Plan*> plan(int m, int n, int k, GemmOut out, cudaStream_t stream = nullptr);
  Status build(Plan& p, int m, int n, int k, GemmOut out);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int>, Plan> plans_;
};

}  // namespace hr::engine
