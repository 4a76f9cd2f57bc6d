// The cuBLASLt stand-in (include/cublasLt.h): D = alpha op(A) op(B) + beta C over column-major
// matrices, bf16 or fp32 elements, fp32 sums.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>
#include <vector>

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {};

namespace {

float element(const cublasLtMatrixLayoutOpaque_t& l, const void* p, uint64_t r, uint64_t c) {
  const size_t at = r + c * static_cast<size_t>(l.ld);
  if (l.type == CUDA_R_32F) return static_cast<const float*>(p)[at];
  uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[at]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void store(const cublasLtMatrixLayoutOpaque_t& l, void* p, uint64_t r, uint64_t c, float v) {
  const size_t at = r + c * static_cast<size_t>(l.ld);
  if (l.type == CUDA_R_32F) {
    static_cast<float*>(p)[at] = v;
    return;
  }
  __nv_bfloat16 h = __float2bfloat16_rn(v);
  std::memcpy(static_cast<uint16_t*>(p) + at, &h, sizeof h);
}

bool valid_layout(const cublasLtMatrixLayoutOpaque_t* l) {
  return l && (l->type == CUDA_R_32F || l->type == CUDA_R_16BF) &&
         l->ld >= static_cast<int64_t>(l->rows);
}

// X, or its transpose, as a dense row-major [rows x inner] float matrix.
std::vector<float> dense(const cublasLtMatrixLayoutOpaque_t& l, const void* p, bool transposed,
                         uint64_t rows, uint64_t inner) {
  std::vector<float> out(rows * inner);
  for (uint64_t i = 0; i < rows; ++i) {
    for (uint64_t k = 0; k < inner; ++k)
      out[i * inner + k] = transposed ? element(l, p, k, i) : element(l, p, i, k);
  }
  return out;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (!desc || size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
  cublasOperation_t op;
  std::memcpy(&op, buf, sizeof op);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA) {
    desc->trans_a = op;
  } else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) {
    desc->trans_b = op;
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return valid_layout(*layout) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void*, size_t) {
  return pref && attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? CUBLAS_STATUS_SUCCESS
                                                                  : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* found) {
  if (!handle || !desc || !a || !b || !c || !d || !pref || requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  if (!handle || !desc || !a_desc || !b_desc || !c_desc || !d_desc || !algo || !alpha || !beta) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const uint64_t m = ta ? a_desc->cols : a_desc->rows, k = ta ? a_desc->rows : a_desc->cols;
  const uint64_t n = tb ? b_desc->rows : b_desc->cols, kb = tb ? b_desc->cols : b_desc->rows;
  if (kb != k || d_desc->rows != m || d_desc->cols != n || c_desc->rows != m || c_desc->cols != n ||
      a_desc->type != CUDA_R_16BF || b_desc->type != CUDA_R_16BF) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float al, be;
  std::memcpy(&al, alpha, sizeof al);
  std::memcpy(&be, beta, sizeof be);
  // Layouts by value: the caller may destroy its descriptors once the matmul is enqueued.
  const cublasLtMatrixLayoutOpaque_t la = *a_desc, lb = *b_desc, lc = *c_desc, ld = *d_desc;
  const cudaError_t e = hr::simt::enqueue(stream, [=] {
    // op(A) [m x k], and op(B) transposed [n x k], so that both run along k.
    const std::vector<float> A = dense(la, a, ta, m, k), B = dense(lb, b, !tb, n, k);
    for (uint64_t j = 0; j < n; ++j) {
      for (uint64_t i = 0; i < m; ++i) {
        // Eight partial sums (as a tensor-core GEMM also sums in its own order), added at the end.
        float part[8] = {};
        const float* x = &A[i * k];
        const float* y = &B[j * k];
        uint64_t q = 0;
        for (; q + 8 <= k; q += 8) {
          for (int u = 0; u < 8; ++u) part[u] += x[q + u] * y[q + u];
        }
        for (; q < k; ++q) part[0] += x[q] * y[q];
        float acc = 0.0f;
        for (float v : part) acc += v;
        float v = al * acc;
        if (be != 0.0f && c) v += be * element(lc, c, i, j);
        store(ld, d, i, j, v);
      }
    }
    return cudaSuccess;
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }
