#include "train/init_from.h"

#include <fmt/format.h>

#include <map>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/replica.h"

namespace mt::train {

namespace {
std::string describe(const model::GptConfig& c) {
  return fmt::format("{} layers, d_model {}, {} heads ({} kv), d_ff {}, vocab {}, {}, {}, {}{}{}",
                     c.n_layer, c.d_model, c.n_head, c.kv_heads(), c.d_ff, c.vocab,
                     model::norm_name(c.norm), model::mlp_name(c.mlp),
                     model::positions_name(c.positions), c.bias ? ", biases" : "",
                     c.tied ? ", tied" : ", untied");
}
}  // namespace

model::GptConfig init_weights_config(const std::string& path, std::optional<int64_t> n_head) {
  return config_from_hf(read_hf_weights(path), n_head);
}

std::unique_ptr<const HfWeights> read_init_weights(const TrainOptions& o) {
  auto w = std::make_unique<HfWeights>(read_hf_weights(o.init_from));
  model::GptConfig file = config_from_hf(*w, o.model.n_head);
  // Rotary positions have no table: a run may use another sequence length.
  if (file.positions == model::Positions::kRope) file.seq_len = o.model.seq_len;
  if (!file.same_model(o.model))
    fail(
        "--init-from '{}' holds another model than this run builds:\n  file: {}\n  run:  {}\n"
        "(leave out --model and the shape flags to train the file's model)",
        o.init_from, describe(file), describe(o.model));
  return w;
}

void init_from_weights(Replica& rep, const HfWeights& w, const model::GptConfig& c) {
  std::map<std::string, std::vector<float>> whole;  // the tensors this rank touches
  ckpt::load_master_values(
      rep, [&](const model::ParamSpec& spec, int64_t lo, int64_t hi, float* dst) {
        auto it = whole.find(spec.name);
        if (it == whole.end())
          it = whole.emplace(spec.name, hf_global_tensor(w.file, w.path, spec, c)).first;
        const std::vector<float>& g = it->second;
        model::for_each_tp_run(spec, [&](int64_t lf, int64_t gf, int64_t len) {
          const int64_t a = std::max(lf, lo), b = std::min(lf + len, hi);
          for (int64_t i = a; i < b; ++i) dst[i - lo] = g[static_cast<size_t>(gf + (i - lf))];
        });
      });
}

}  // namespace mt::train
