// cuBLASLt GEMM plans. Row-major y = x · w^T is column-major y^T = w · x^T: A = w (k x n,
// transposed), B = x (k x m), D = y^T (n x m).
#include "engine/cuda_gemm.h"

#include <string>

namespace hr::engine {
namespace {

Status lt_error(const char* op, cublasStatus_t s) {
  return internal_error(std::string("cuBLASLt ") + op + " failed: status " +
                        std::to_string(static_cast<int>(s)));
}

}  // namespace

#define HR_LT(op, expr)                                               \
  do {                                                                \
    cublasStatus_t hr_lt_ = (expr);                                   \
    if (hr_lt_ != CUBLAS_STATUS_SUCCESS) return lt_error(op, hr_lt_); \
  } while (0)

Result<std::unique_ptr<CublasLtGemm>> CublasLtGemm::create(size_t workspace_bytes) {
  std::unique_ptr<CublasLtGemm> g(new CublasLtGemm());
  HR_LT("create", cublasLtCreate(&g->handle_));
  if (workspace_bytes > 0) {
    cudaError_t err = cudaMalloc(&g->workspace_, workspace_bytes);
    if (err != cudaSuccess) {
      return internal_error(std::string("cudaMalloc of the GEMM workspace: ") +
                            cudaGetErrorString(err));
    }
    g->workspace_bytes_ = workspace_bytes;
  }
  return g;
}

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, p] : plans_) destroy(p);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

void CublasLtGemm::destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

Status CublasLtGemm::build(Plan& p, int m, int n, int k, GemmOut out) {
  const cudaDataType_t dt = out == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  HR_LT("matmul desc", cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  HR_LT("set transa", cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                     sizeof trans_a));
  HR_LT("set transb", cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                     sizeof trans_b));
  HR_LT("layout a", cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
  HR_LT("layout b", cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));
  HR_LT("layout d", cublasLtMatrixLayoutCreate(&p.d, dt, n, m, n));
  cublasLtMatmulPreference_t pref;
  HR_LT("preference", cublasLtMatmulPreferenceCreate(&pref));
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  const std::string shape =
      std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " bf16 GEMM";
  if (s != CUBLAS_STATUS_SUCCESS) {
    return internal_error("cuBLASLt could not choose an algorithm for a " + shape + ": " +
                          cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
  }
  if (found == 0) return internal_error("cuBLASLt has no algorithm for a " + shape);
  p.algo = result.algo;
  return Status::ok();
}

Result<const CublasLtGemm::Plan*> CublasLtGemm::plan(int m, int n, int k, GemmOut out,
                                                     cudaStream_t stream) {
  auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (stream && cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
      capturing != cudaStreamCaptureStatusNone) {
    return internal_error("a " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                          std::to_string(k) +
                          " GEMM in a graph capture was not prepared before it");
  }
  Plan p;
  Status built = build(p, m, n, k, out);
  if (!built.is_ok()) {
    destroy(p);  // whatever was created before the failure
    return built;
  }
  return &plans_.emplace(key, p).first->second;
}

Status CublasLtGemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, GemmOut out,
                         int m, int n, int k, cudaStream_t stream) {
  if (m <= 0) return Status::ok();
  HR_ASSIGN_OR_RETURN(const Plan* p, plan(m, n, k, out, stream));
  const float alpha = 1.0f, beta = 0.0f;
  HR_LT("matmul", cublasLtMatmul(handle_, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                 &p->algo, workspace_, workspace_bytes_, stream));
  return Status::ok();
}

}  // namespace hr::engine
