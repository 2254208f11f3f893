// Memory: the activation bytes a cp rank keeps, measured by the accounting allocator, against
// the formula of docs/context_parallel.md. With the flash kernel a block keeps, per local
// token (T/N of each sequence), exactly
//   out, ln1, atty, res2, ln2: 5C;  q|k|v: qkv_dim;  fc, activation: fc_dim + F;
//   the two norms' statistics: 4;  the attention's lse: n_head
// floats: 4·B·(T/N)·(5C + qkv_dim + fc_dim + F + 4 + n_head) bytes per layer, 1/N of the
// single rank's (with the same kernel). Every other activation (embedding output, final norm,
// logits, losses) is per token too, so the whole model's activations fall as 1/N exactly.
#include <gtest/gtest.h>

#include "core/memory.h"
#include "kernels/kernels.h"
#include "model/gpt.h"

namespace mt::model {
namespace {

// Activation bytes of a model with L layers on cp rank 0 of N (building activations does not
// communicate: the context needs no group).
int64_t activation_bytes(GptConfig c, int L, int N, int64_t B) {
  c.n_layer = L;
  mem::Tracker tracker;
  mem::ScopedTracker scope(tracker);
  kernels::set_fused_attention(true);  // the flash kernel's stash, as every cp rank runs
  Gpt gpt(c, 1);
  parallel::cp::CpContext cp;
  cp.size = N;
  gpt.set_context_parallel(cp);
  const int64_t before = tracker.snapshot().of(mem::Category::kActivations);
  Activations a = gpt.make_activations(B, c.seq_len / N);
  const int64_t bytes = tracker.snapshot().of(mem::Category::kActivations) - before;
  kernels::set_fused_attention(false);
  return bytes;
}

int64_t formula(const GptConfig& c, int N, int64_t B) {
  const int64_t C = c.d_model;
  return 4 * B * (c.seq_len / N) * (5 * C + c.qkv_dim() + c.fc_dim() + c.d_ff + 4 + c.n_head);
}

TEST(CpMemory, OneLayerFollowsTheFormulaAndFallsAsOneOverN) {
  GptConfig gpt = preset("tiny");
  gpt.seq_len = 256;
  GptConfig llama = preset("llama-tiny");  // grouped-query q|k|v, SwiGLU's gate|up
  llama.seq_len = 256;
  const int64_t B = 2;
  for (const GptConfig& c : {gpt, llama}) {
    const int64_t one = activation_bytes(c, 2, 1, B) - activation_bytes(c, 1, 1, B);
    for (int N : {1, 2, 4, 8}) {
      const int64_t layer = activation_bytes(c, 2, N, B) - activation_bytes(c, 1, N, B);
      EXPECT_EQ(layer, formula(c, N, B)) << c.name << " cp " << N;
      EXPECT_EQ(layer * N, one) << c.name << " cp " << N;
      // The whole model (embedding output, logits, ...) as well.
      EXPECT_EQ(activation_bytes(c, 2, N, B) * N, activation_bytes(c, 2, 1, B))
          << c.name << " cp " << N;
      std::printf("%s cp %d: one layer %lld bytes (formula %lld)\n", c.name.c_str(), N,
                  static_cast<long long>(layer), static_cast<long long>(formula(c, N, B)));
    }
  }
}

}  // namespace
}  // namespace mt::model
