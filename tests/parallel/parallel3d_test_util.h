// Shared by the 3D tests (dp x tp x pp, docs/parallel_3d.md): a 4-layer model with 12 heads
// of 8 (d_model 96, d_ff 384, seq 24: heads divide over tp 2, 3, 4 and layers over pp 2, 4
// or 2 x 2 interleaved chunks), global batch 16, on the demo text; and the comparison of two
// runs' exported weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "test_util.h"
#include "tiny_run.h"
#include "train/safetensors.h"
#include "train/trainer.h"

namespace mt::test {

struct Layout3d {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  bool sp = false;
  int microbatches = 0;  // per replica; 0: 4 with pp > 1
  int ep = 1;            // expert-parallel ranks, carved from dp (MoE models)
  int cp = 1;            // context-parallel ranks (world = pp x dp x cp x tp)
};

inline std::string name_of(const Layout3d& l) {
  std::string n = "dp" + std::to_string(l.dp) + "_tp" + std::to_string(l.tp) + "_pp" +
                  std::to_string(l.pp) + "_zero" + std::to_string(l.zero);
  if (l.pp > 1)
    n += "_" + l.schedule + (l.virtual_stages > 1 ? "_v" + std::to_string(l.virtual_stages) : "");
  if (l.sp) n += "_sp";
  if (l.ep > 1) n += "_ep" + std::to_string(l.ep);
  if (l.cp > 1) n += "_cp" + std::to_string(l.cp);
  return n;
}

// One scratch directory per process (scratch_dir empties it on every call).
inline const std::filesystem::path& dir3d() {
  static const std::filesystem::path dir = scratch_dir("3d");
  return dir;
}

inline const std::string& demo3d_data() {
  static const std::string path = demo_tokens(dir3d());
  return path;
}

inline train::TrainOptions options3d(const Layout3d& l, int64_t steps) {
  train::TrainOptions o = tiny_run(demo3d_data(), steps, 24, 16);
  o.model.n_layer = 4;
  o.model.n_head = 12;
  o.model.d_model = 96;
  o.model.d_ff = 384;
  o.backend = "local";
  o.bucket_mb = 0.25;
  o.dp = l.dp;
  o.ep = l.ep;
  o.cp = l.cp;
  o.tp = l.tp;
  o.sp = l.sp;
  o.zero = l.zero;
  o.pipeline.pp = l.pp;
  o.pipeline.schedule = l.schedule;
  o.pipeline.virtual_stages = l.virtual_stages;
  o.pipeline.microbatches = l.pp > 1 ? (l.microbatches > 0 ? l.microbatches : 4) : 0;
  return o;
}

// The 3D tests' Llama: RMSNorm, rotary positions with Llama 3 scaling (a short original
// context, so every band is used), SwiGLU, 8 query heads sharing 4 kv heads (head dim 8), no
// biases, untied; 4 layers like the GPT model.
inline void make_llama3d(model::GptConfig& c) {
  c.name = "llama-3d";
  c.n_layer = 4;
  c.n_head = 8;
  c.n_kv_head = 4;
  c.d_model = 64;
  c.d_ff = 176;
  c.bias = false;
  c.tied = false;
  c.norm = model::NormKind::kRmsNorm;
  c.mlp = model::MlpKind::kSwiGlu;
  c.positions = model::Positions::kRope;
  c.rope_theta = 10000;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position = 16;
}

// Largest |difference| between the tensors of two exported weight files (same names):
// infinity where the names or sizes differ or a file is empty, NaN where a difference is.
inline double max_weight_diff(const std::string& a, const std::string& b, std::string* where) {
  const train::SafetensorsFile fa = train::read_safetensors(a), fb = train::read_safetensors(b);
  if (fa.arrays.size() != fb.arrays.size() || fa.arrays.empty()) return INFINITY;
  double worst = 0;
  for (const auto& [name, x] : fa.arrays) {
    auto it = fb.arrays.find(name);
    if (it == fb.arrays.end() || it->second.data.size() != x.data.size()) return INFINITY;
    for (size_t i = 0; i < x.data.size(); ++i) {
      const double d = std::abs(static_cast<double>(x.data[i]) - it->second.data[i]);
      if (std::isnan(d)) return d;
      if (d > worst) {
        worst = d;
        if (where) *where = name;
      }
    }
  }
  return worst;
}

// Under mpirun: every process trains `layout` on the mpi backend, then rank 0 trains
// `oracle` (one rank, local backend) and checks every step's loss and the exported weights
// within 5e-5 (the f32 bound of equiv_check.h). Both export into dir3d() under `tag`.
// Returns the layout's result (on every rank) and, on rank 0, the largest weight difference.
struct MpiAgainstOracle {
  train::TrainResult layout;
  double weight_diff = 0;
};
inline MpiAgainstOracle train_mpi_against_oracle(train::TrainOptions layout,
                                                 train::TrainOptions oracle,
                                                 const std::string& tag) {
  std::string file = tag;
  std::replace(file.begin(), file.end(), ' ', '_');
  layout.backend = "mpi";
  layout.export_path = dir3d() / (file + "_layout.safetensors");
  MpiAgainstOracle m{train::run_training(layout)};
  if (env_int("OMPI_COMM_WORLD_RANK", 0) != 0) return m;
  oracle.export_path = dir3d() / (file + "_oracle.safetensors");
  const train::TrainResult ref = train::run_training(oracle);
  EXPECT_EQ(m.layout.steps.size(), ref.steps.size()) << tag;
  for (size_t i = 0; i < std::min(m.layout.steps.size(), ref.steps.size()); ++i)
    EXPECT_NEAR(m.layout.steps[i].loss, ref.steps[i].loss, 5e-5) << tag << " step " << i + 1;
  m.weight_diff = max_weight_diff(layout.export_path, oracle.export_path, nullptr);
  EXPECT_LT(m.weight_diff, 5e-5) << tag;
  std::printf("mpi %s: max |weight diff| %.2e\n", tag.c_str(), m.weight_diff);
  return m;
}

}  // namespace mt::test
