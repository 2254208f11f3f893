// Blockwise attention with an online softmax (flash-attention style) on the CPU, f32: the
// T x T probabilities are never stored. Forward keeps the output and each row's log-sum-exp
// (B·NH·T floats); backward recomputes the probabilities block by block from them. Causal
// masking skips whole key blocks above the diagonal. docs/context_parallel.md, "The kernel".
//
// Two levels:
//  - the piece: queries at global positions [q_pos0, q_pos0 + Tq) against keys and values
//    at [k_pos0, k_pos0 + Tk), each operand a strided view (HeadRows) so that the queries
//    of a local qkv can meet keys gathered or received from other ranks (context
//    parallelism); pieces combine by their log-sum-exp (attention_merge);
//  - the model's layout (qkv [B, T, 3C] as kernels.h's attention), causal: what a block runs
//    with `--attention flash` on the CPU.
#pragma once

#include <cstdint>

namespace mt::kernels {

// Row t of batch b of one operand, head h: p + b·batch_stride + t·row_stride + h·hd.
struct HeadRows {
  const float* p = nullptr;
  int64_t row_stride = 0, batch_stride = 0;
};
struct HeadRowsOut {
  float* p = nullptr;
  int64_t row_stride = 0, batch_stride = 0;
  operator HeadRows() const { return {p, row_stride, batch_stride}; }
};

struct AttentionPiece {
  int64_t B = 0, NH = 0, hd = 0;
  int64_t Tq = 0, Tk = 0;          // query rows, key (= value) rows
  int64_t q_pos0 = 0, k_pos0 = 0;  // global positions of the first query and key rows
  bool causal = true;              // a key at a later position than the query is masked
  int64_t lse_stride = 0;          // floats between the (b, h) rows of lse; 0: Tq
  // Grouped-query attention: query heads per key/value head (head h reads k and v head
  // h / kv_group); k, v, dk and dv then hold NH / kv_group heads.
  int64_t kv_group = 1;
  int64_t lse_ld() const { return lse_stride > 0 ? lse_stride : Tq; }
};

// The query and key blocks of the kernel (rows of Q and of K per inner GEMM). Measured
// (`meshtrain bench ops`, 1 thread): 128 x 256 beat 64 x 128, 64 x 256 and 32 x 128 at
// T = 256 and 2048; smaller blocks pay oneDNN's per-call overhead and more rescaling.
inline constexpr int64_t kFlashQueryBlock = 128;
inline constexpr int64_t kFlashKeyBlock = 256;

// o = softmax(q·kᵀ/√hd + mask)·v (overwritten); lse [B, NH, lse_ld] = the log of each row's
// sum of exp(scores) (-inf for a row that sees no key; its o row is 0).
void flash_attention_forward(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v,
                             HeadRowsOut o, float* lse);
// Gradients of the piece, ACCUMULATED (+=) into dq, dk and dv. o and lse are the row's
// final output and log-sum-exp over all its keys (after merging pieces), dout = d(loss)/do.
// Scratch: thread-local, grows once.
void flash_attention_backward(const AttentionPiece& s, HeadRows q, HeadRows k, HeadRows v,
                              HeadRows o, HeadRows dout, const float* lse, HeadRowsOut dq,
                              HeadRowsOut dk, HeadRowsOut dv);
// Two pieces of the same query rows over disjoint keys, combined: (o, lse) becomes the
// attention over both key sets from (o, lse) and (o2, lse2). lse2 = -inf leaves o as it is.
void attention_merge(const AttentionPiece& s, HeadRowsOut o, float* lse, HeadRows o2,
                     const float* lse2);

// The counts of (query block, key block) pairs the forward multiplies, summed over (b, h):
// the kernel's work, for the balance of context parallelism's split (tests).
int64_t flash_attention_block_pairs(const AttentionPiece& s);

// The model's layout: qkv [B, T, 3C] (q | k | v, head h at columns h·hd), out [B, T, C],
// causal, positions 0..T-1. lse [B·NH·T]. Backward overwrites dqkv.
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH);
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace mt::kernels
