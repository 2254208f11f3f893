// Kernels of the vocabulary-parallel embedding and cross-entropy (Megatron-LM's
// VocabParallelEmbedding and vocab_parallel_cross_entropy): each works on one rank's slice
// of the vocabulary, columns/rows [v0, v0 + cols) of the padded vocabulary, of which the
// first `real` are real tokens (the rest padding, never part of the softmax). The
// reductions over the tensor-parallel group happen between these calls (model/gpt.cpp).
#pragma once

#include <cstdint>

namespace mt::kernels {

// mx[i] = max over the slice's real columns of logits[i, :] (-inf when real == 0).
void vocab_parallel_max(float* mx, const float* logits, int64_t n, int64_t cols, int64_t real);
// sum_exp[i] = sum over real columns of exp(logits[i, j] - mx[i]);
// target_logit[i] = logits[i, targets[i] - v0] if this slice holds the target, else 0.
void vocab_parallel_sum_exp(float* sum_exp, float* target_logit, const float* logits,
                            const float* mx, const int32_t* targets, int64_t n, int64_t cols,
                            int64_t real, int64_t v0);
// lse[i] = mx[i] + log(sums[i]); losses[i] = lse[i] - sums[n + i] (sums as all-reduced:
// the sum of exp, then the target's logit).
void vocab_parallel_lse(float* lse, float* losses, const float* mx, const float* sums, int64_t n);
// dlogits[i, j] = (exp(logits[i, j] - lse[i]) - [v0 + j == target_i]) * dloss on real
// columns, 0 on padding. dlogits may alias logits.
void vocab_parallel_ce_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, float dloss, int64_t n, int64_t cols,
                                int64_t real, int64_t v0);

// y[i, :] = wte[tokens[i] - v0, :] when v0 <= tokens[i] < v0 + rows, else 0 (overwritten).
void vocab_parallel_embedding_forward(float* y, const int32_t* tokens, const float* wte, int64_t n,
                                      int64_t C, int64_t v0, int64_t rows);
// dwte[tokens[i] - v0, :] += dy[i, :] for the tokens this slice holds.
void vocab_parallel_embedding_backward(float* dwte, const float* dy, const int32_t* tokens,
                                       int64_t n, int64_t C, int64_t v0, int64_t rows);
// Rows [first, first + n) of a [B·T, C] microbatch: y[i, :] += wpe[(first + i) % T, :].
void add_position_embedding(float* y, const float* wpe, int64_t first, int64_t n, int64_t T,
                            int64_t C);
// dwpe[(first + i) % T, :] += dy[i, :].
void position_embedding_backward(float* dwpe, const float* dy, int64_t first, int64_t n, int64_t T,
                                 int64_t C);
// The same with the positions of a context-parallel split (CPU only): row i of the n rows
// is local row (first + i) % T of its sequence, at global position pos[(first + i) % T].
void add_position_rows(float* y, const float* wpe, const int32_t* pos, int64_t first, int64_t n,
                       int64_t T, int64_t C);
void position_rows_backward(float* dwpe, const float* dy, const int32_t* pos, int64_t first,
                            int64_t n, int64_t T, int64_t C);
// y[i, :] += b for the n rows of [n, c].
void add_bias(float* y, const float* b, int64_t n, int64_t c);

}  // namespace mt::kernels
