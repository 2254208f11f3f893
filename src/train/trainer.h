// The training loop of one rank: data -> microbatches -> forward/backward -> clip ->
// AdamW -> metrics. Everything it allocates is allocated before the first step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/optimizer.h"

namespace mt::train {

struct TrainOptions {
  model::GptConfig model = model::preset("tiny");
  int64_t batch = 16;      // global batch, in sequences
  int64_t microbatch = 0;  // sequences per forward/backward; 0 = the whole batch
  int64_t steps = 100;
  float lr = 1e-3f;
  float min_lr_ratio = 0.1f;  // cosine decays to this fraction of lr
  int64_t warmup = -1;        // -1: 5% of the steps
  AdamWConfig adamw;
  float grad_clip = 1.0f;  // 0: off
  uint64_t seed = 1337;
  std::string data;
  std::string val_data;        // "": hold out the last val_fraction of `data`
  double val_fraction = 0.05;
  int64_t eval_every = 0;      // 0: only at the end
  int64_t eval_batches = 4;
  int threads = 0;             // 0: cores on the host / ranks on the host
  std::string metrics;         // JSON lines, one per step
  std::string export_path;     // safetensors of the final weights
  bool profile = false;        // per-kernel time breakdown at the end
  double peak_flops = 0;       // 0: measured GEMM peak (`meshtrain bench peak`)
  bool quiet = false;          // no per-step lines (tests)
  bool keep_final_params = false;  // copy the final weights into TrainResult

  int64_t microbatch_size() const { return microbatch > 0 ? microbatch : batch; }
  void validate() const;
};

struct StepRecord {
  int64_t step = 0;
  float loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  int64_t peak_bytes = 0;
  double time_s = 0;
};

struct TrainResult {
  std::vector<StepRecord> steps;
  std::vector<std::pair<int64_t, float>> val_losses;  // (step, loss)
  int64_t allocations_after_first_step = 0;  // allocations made by steps 2..N (should be 0)
  std::vector<float> final_params;           // flat, for equivalence checks
};

TrainResult run_training(const TrainOptions& opts);

}  // namespace mt::train
