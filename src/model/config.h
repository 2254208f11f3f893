// The shape of a GPT-2-style model, its presets, and the refusals of bad shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::model {

// The vocabulary is padded to a multiple of this (GPT-2's 50257 -> 50304) so that the
// embedding and LM-head GEMMs have friendly shapes; padded rows are zero and never
// change the loss.
constexpr int64_t kVocabPadMultiple = 128;

struct GptConfig {
  std::string name = "custom";
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;      // MLP hidden width (GPT-2: 4 * d_model)
  int64_t vocab = 0;     // real vocabulary
  int64_t seq_len = 0;   // maximum sequence length (rows of the position embedding)
  bool bias = true;      // biases in linear layers and layer norms
  bool tied = true;      // LM head shares the token embedding
  // The vocabulary is padded to a multiple of this: 128, or lcm(128, tp) with tensor
  // parallelism so that every tp rank holds the same number of rows (tp_vocab_pad).
  int64_t vocab_pad_multiple = kVocabPadMultiple;

  int64_t padded_vocab() const {
    return (vocab + vocab_pad_multiple - 1) / vocab_pad_multiple * vocab_pad_multiple;
  }
  int64_t head_dim() const { return d_model / n_head; }
  // Refuses an impossible shape with a message naming the value and the fix.
  void validate() const;
};

// Tensor parallelism over tp ranks (with sequence parallelism when sp): refuses, before
// any work, a tp that does not divide n_head or d_ff, or (sp) the sequence length, with a
// message naming the valid values.
void check_tp(const GptConfig& c, int tp, bool sp);
// lcm(128, tp): the vocabulary padding that splits evenly over tp ranks.
int64_t tp_vocab_pad(int tp);

GptConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace mt::model
