#include "train/evaluate.h"

namespace mt::train {

float evaluate(Replica& r, int d, int D, model::Activations* acts, PipelineStage* stage,
               comm::Group& ppg, const SequenceSampler& val, int64_t batches, int64_t B,
               int64_t n_micro, int64_t mb, comm::Group* scalars, std::vector<int32_t>& in,
               std::vector<int32_t>& tgt) {
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    if (stage) {
      sum +=
          stage->forward_only(ppg, val, first_sample(k, B, d, D, 0, mb), static_cast<int>(n_micro));
      continue;
    }
    acts->routing_sample = -1;  // validation routes on its own (no tape)
    for (int64_t m = 0; m < n_micro; ++m) {
      val.fill(first_sample(k, B, d, D, m, mb), mb, in.data(), tgt.data(), r.gpt.local_positions());
      sum += r.gpt.forward(*acts, in.data(), tgt.data());
    }
  }
  if (r.gpt.tp().rank != 0 || !r.gpt.parts().head) sum = 0;  // count each loss once
  if (scalars) {
    float s = static_cast<float>(sum);
    scalars->all_reduce(comm::Buf(&s, 1));
    sum = s;
  }
  // D data-parallel ranks x cp (each cp rank's loss a mean over its rows).
  return static_cast<float>(sum / static_cast<double>(batches * n_micro * D * r.gpt.cp().size));
}

}  // namespace mt::train
