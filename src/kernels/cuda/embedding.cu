// Token and position embeddings, and their backward. The token backward is deterministic
// (the same bits run to run, and the CPU's order of additions): positions are sorted by
// token with a stable radix sort, then each distinct token's block adds its dy rows in
// position order. No float atomics.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/context.h"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace mt::kernels::cuda {
namespace detail {
namespace {

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void accumulate_rows_by_token(float* dw, const float* dy, const int32_t* tokens, int64_t n,
                              int64_t C, int64_t v0, int64_t rows) {
  if (n == 0 || C == 0) return;
  if (n > INT32_MAX) fail_input("embedding backward: n=" + str(n) + " positions exceed 2^31-1");
  const int items = static_cast<int>(n);
  size_t temp_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), items, 0, 32, stream()),
             "cub::DeviceRadixSort::SortPairs (temp size)");
  const size_t arr = round_up(static_cast<size_t>(n) * 4);
  char* base = static_cast<char*>(scratch(Scratch::kSort, 4 * arr + round_up(temp_bytes)));
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + arr);
  auto* vals_in = reinterpret_cast<int32_t*>(base + 2 * arr);
  auto* vals_out = reinterpret_cast<int32_t*>(base + 3 * arr);
  void* temp = base + 4 * arr;
  token_keys_kernel<<<grid_for(n), kThreads, 0, stream()>>>(keys_in, vals_in, tokens, n, v0, rows);
  check_launch("token_keys_kernel");
  check_cuda(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                             items, 0, 32, stream()),
             "cub::DeviceRadixSort::SortPairs");
  accumulate_sorted_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(dw, dy, keys_out,
                                                                               vals_out, n, C);
  check_launch("accumulate_sorted_kernel");
}

}  // namespace detail

namespace {

using namespace detail;

void check_emb(const char* what, int64_t B, int64_t T, int64_t C) {
  check_nonneg(what, "B", B);
  check_nonneg(what, "T", T);
  check_nonneg(what, "C", C);
}

}  // namespace

void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
  check_emb("embedding_forward", B, T, C);
  const int64_t total = B * T * C;
  if (total == 0) return;
  embedding_forward_kernel<<<grid_for(total), kThreads, 0, stream()>>>(y, tokens, wte, wpe, T, C,
                                                                       total);
  check_launch("embedding_forward_kernel");
}

void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  check_emb("embedding_backward", B, T, C);
  if (B * T * C == 0) return;
  // Every non-negative token is a row of dwte (the CPU does not check the upper end either).
  accumulate_rows_by_token(dwte, dy, tokens, B * T, C, 0, int64_t{INT32_MAX} + 1);
  if (!dwpe) return;
  position_backward_kernel<<<grid_for(T * C), kThreads, 0, stream()>>>(dwpe, dy, B, T, C);
  check_launch("position_backward_kernel");
}

}  // namespace mt::kernels::cuda
