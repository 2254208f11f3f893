// The layers of a GPT-2 block, each an explicit forward/backward pair (llm.c style).
// Forward writes what backward needs into the caller's activation buffers; backward
// accumulates parameter gradients into the Param's gradient view.
#pragma once

#include <cstdint>

#include "model/params.h"

namespace mt::model {

struct LayerNorm {
  Param* w = nullptr;
  Param* b = nullptr;  // null without bias
  int64_t c = 0;
  void forward(float* y, float* mean, float* rstd, const float* x, int64_t n) const;
  // dx += d(loss)/dx
  void backward(float* dx, const float* dy, const float* x, const float* mean,
                const float* rstd, int64_t n) const;
};

struct Linear {
  Param* w = nullptr;  // [out, in]
  Param* b = nullptr;  // [out] or null
  int64_t in = 0, out = 0;
  void forward(float* y, const float* x, int64_t n) const;
  // dx overwritten (skipped when null)
  void backward(float* dx, const float* dy, const float* x, int64_t n) const;
};

// Activations of one block for one microbatch: exactly what its backward reads.
struct BlockActivations {
  Tensor ln1, ln1_mean, ln1_rstd;  // [N, C], [N], [N]
  Tensor qkv;                      // [N, 3C]
  Tensor att;                      // [B, NH, T, T] softmax probabilities
  Tensor atty;                     // [N, C] attention output before c_proj
  Tensor res2;                     // [N, C] x + attention branch
  Tensor ln2, ln2_mean, ln2_rstd;  // [N, C], [N], [N]
  Tensor fch;                      // [N, F] before GELU
  Tensor fch_gelu;                 // [N, F]
  Tensor out;                      // [N, C] block output (= next block's input)
};

// Backward scratch shared by all blocks (one set per rank).
struct BlockScratch {
  Tensor dln;    // [N, C]
  Tensor datty;  // [N, C]
  Tensor dqkv;   // [N, 3C]
  Tensor dfch;   // [N, F]
  Tensor dgelu;  // [N, F]
  Tensor datt;   // [B, NH, T, T]
};

struct Block {
  LayerNorm ln_1, ln_2;
  Linear c_attn, attn_proj, c_fc, mlp_proj;
  int64_t n_head = 0;

  static BlockActivations make_activations(const GptConfig& c, int64_t B, int64_t T);
  static BlockScratch make_scratch(const GptConfig& c, int64_t B, int64_t T);

  void forward(BlockActivations& a, const float* x, int64_t B, int64_t T) const;
  // dres holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit.
  void backward(float* dres, BlockScratch& s, const BlockActivations& a, const float* x,
                int64_t B, int64_t T) const;
};

}  // namespace mt::model
