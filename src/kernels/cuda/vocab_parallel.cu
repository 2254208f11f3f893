// The vocabulary-parallel kernels of vocab_parallel.h (one rank's slice [v0, v0 + cols) of
// the padded vocabulary, of which the first `real` columns are real), as
// kernels/vocab_parallel.cpp.
#include <cmath>

#include "kernels/cuda/context.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/vocab_parallel_kernels.cuh"

// The kernels (in the *_kernels.cuh) are done with it.
#undef MT_GRID_STRIDE

namespace mt::kernels::cuda {
namespace {

using namespace detail;

void check_rows(const char* what, int64_t n) {
  check_nonneg(what, "n", n);
  if (n > INT32_MAX) fail_input(std::string(what) + ": n=" + str(n) + " rows exceed 2^31-1");
}

}  // namespace

void vocab_parallel_max(float* mx, const float* logits, int64_t n, int64_t cols, int64_t real) {
  check_rows("vocab_parallel_max", n);
  if (real < 0 || real > cols)
    fail_input("vocab_parallel_max: need 0 <= real <= cols, got real=" + str(real) + " cols=" + str(cols));
  if (n == 0) return;
  vp_max_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(mx, logits, cols, real);
  check_launch("vp_max_kernel");
}

void vocab_parallel_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                            const float* mx, const int32_t* targets, int64_t n, int64_t cols,
                            int64_t real, int64_t v0) {
  check_rows("vocab_parallel_sum_exp", n);
  if (real < 0 || real > cols)
    fail_input("vocab_parallel_sum_exp: need 0 <= real <= cols, got real=" + str(real) +
               " cols=" + str(cols));
  if (n == 0) return;
  vp_sum_exp_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      sum_exp, target_logit, logits, mx, targets, cols, real, v0);
  check_launch("vp_sum_exp_kernel");
}

void vocab_parallel_lse(float* lse, float* losses, const float* mx, const float* sums, int64_t n) {
  check_nonneg("vocab_parallel_lse", "n", n);
  if (n == 0) return;
  vp_lse_kernel<<<grid_for(n), kThreads, 0, stream()>>>(lse, losses, mx, sums, n);
  check_launch("vp_lse_kernel");
}

void vocab_parallel_ce_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, float dloss, int64_t n, int64_t cols,
                                int64_t real, int64_t v0) {
  check_nonneg("vocab_parallel_ce_backward", "n", n);
  check_nonneg("vocab_parallel_ce_backward", "cols", cols);
  if (n * cols == 0) return;
  vp_ce_backward_kernel<<<grid_for(n * cols), kThreads, 0, stream()>>>(dlogits, logits, lse, targets,
                                                                       dloss, n, cols, real, v0);
  check_launch("vp_ce_backward_kernel");
}

void vocab_parallel_embedding_forward(float* y, const int32_t* tokens, const float* wte, int64_t n,
                                      int64_t C, int64_t v0, int64_t rows) {
  check_nonneg("vocab_parallel_embedding_forward", "n", n);
  check_nonneg("vocab_parallel_embedding_forward", "C", C);
  if (n * C == 0) return;
  vp_embedding_forward_kernel<<<grid_for(n * C), kThreads, 0, stream()>>>(y, tokens, wte, n, C, v0,
                                                                          rows);
  check_launch("vp_embedding_forward_kernel");
}

void vocab_parallel_embedding_backward(float* dwte, const float* dy, const int32_t* tokens,
                                       int64_t n, int64_t C, int64_t v0, int64_t rows) {
  check_nonneg("vocab_parallel_embedding_backward", "n", n);
  check_nonneg("vocab_parallel_embedding_backward", "C", C);
  if (rows > int64_t{UINT32_MAX} - 1)
    fail_input("vocab_parallel_embedding_backward: rows=" + str(rows) + " exceeds 2^32-2");
  detail::accumulate_rows_by_token(dwte, dy, tokens, n, C, v0, rows);
}

void add_position_embedding(float* y, const float* wpe, int64_t first, int64_t n, int64_t T,
                            int64_t C) {
  check_nonneg("add_position_embedding", "n", n);
  check_nonneg("add_position_embedding", "C", C);
  check_nonneg("add_position_embedding", "first", first);
  if (T < 1) fail_input("add_position_embedding: T must be >= 1, got " + str(T));
  if (n * C == 0) return;
  add_position_kernel<<<grid_for(n * C), kThreads, 0, stream()>>>(y, wpe, first, n, T, C);
  check_launch("add_position_kernel");
}

void position_embedding_backward(float* dwpe, const float* dy, int64_t first, int64_t n, int64_t T,
                                 int64_t C) {
  check_nonneg("position_embedding_backward", "n", n);
  check_nonneg("position_embedding_backward", "C", C);
  check_nonneg("position_embedding_backward", "first", first);
  if (T < 1) fail_input("position_embedding_backward: T must be >= 1, got " + str(T));
  if (n * C == 0) return;
  position_backward_rows_kernel<<<grid_for(T * C), kThreads, 0, stream()>>>(dwpe, dy, first, n, T,
                                                                             C);
  check_launch("position_backward_rows_kernel");
}

}  // namespace mt::kernels::cuda
