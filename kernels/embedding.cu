// Embedding gather, 16-byte loads.
#include "kernels/embedding.cuh"
#include "kernels/internal/common.cuh"

namespace hr::kernels {
namespace {

__global__ void embedding_gather_kernel(const __nv_bfloat16* table, const int32_t* ids,
                                        const int32_t* fed_rows, const int32_t* fed_tokens,
                                        int vocab, int dim, float* out, int32_t* ids_out) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int t = blockIdx.x;
  const int fed = fed_rows ? fed_rows[t] : -1;
  int32_t id = fed >= 0 ? fed_tokens[fed] : ids[t];
  if (ids_out && threadIdx.x == 0) ids_out[t] = id;
  if (!out) return;  // the ids alone
  // A fed token may be the sampler's -1 (a row with no valid logit): read row 0 rather than
  // outside the table; the host ends that sequence when it collects the -1.
  if (id < 0 || id >= vocab) id = 0;
  const uint4* row = reinterpret_cast<const uint4*>(table + static_cast<size_t>(id) * dim);
  float4* dst = reinterpret_cast<float4*>(out + static_cast<size_t>(t) * dim);
  for (int v = threadIdx.x; v < dim / 8; v += blockDim.x) {
    float f[8];
    internal::bf16x8_to_float(row[v], f);
    dst[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
    dst[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

}  // namespace

cudaError_t embedding_gather(const __nv_bfloat16* table, const int32_t* ids,
                             const int32_t* fed_rows, const int32_t* fed_tokens, int num_tokens,
                             int vocab, int dim, float* out, int32_t* ids_out,
                             cudaStream_t stream) {
  if (num_tokens < 0 || vocab <= 0 || dim <= 0 || dim % 8 != 0 || !ids ||
      (fed_rows && !fed_tokens) || !table != !out || (!out && !ids_out)) {
    return cudaErrorInvalidValue;
  }
  if (!internal::aligned16(table) || !internal::aligned16(out)) return cudaErrorMisalignedAddress;
  if (num_tokens == 0) return cudaSuccess;
  return internal::launch(embedding_gather_kernel, dim3(num_tokens), dim3(128), 0, stream, table,
                          ids, fed_rows, fed_tokens, vocab, dim, out, ids_out);
}

}  // namespace hr::kernels
