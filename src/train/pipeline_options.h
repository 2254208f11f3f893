// Options and per-rank results of pipeline-parallel training (docs/pipeline.md); the loop
// itself is train/trainer.cpp with train/pipeline_stage.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::train {

struct PipelineOptions {
  int pp = 1;                     // pipeline ranks (world = pp x dp)
  int microbatches = 0;           // per step and dp replica; 0: pp
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved, zb1
  int virtual_stages = 1;         // chunks per rank (interleaved)
  // Megatron-LM's batched exchanges (parallel::pp::Lowering::kBatched): "auto" (batched with
  // the nccl backend, whose point-to-point blocks), "batched" or "per-action".
  std::string exchanges = "auto";
  std::string layers;  // --pp-layers "5,7,7,5"; "": balanced by estimated cost
  std::string trace;   // Chrome/Perfetto trace of the steps ("": none)
};

struct PipelineRankStats {
  int rank = -1, pp_rank = 0, dp_rank = 0;
  std::vector<int> chunks;            // global chunk ids of this rank
  std::vector<int> chunk_layers;      // blocks per chunk
  int schedule_peak = 0;              // peak_in_flight() of the schedule: (microbatch, chunk) pairs
  int held_peak = 0;                  // measured: most activation buffers holding one at once
  int pool_buffers = 0;               // activation buffers allocated
  int64_t buffer_bytes = 0;           // bytes of one activation buffer
  int64_t activation_peak_bytes = 0;  // the allocator's peak of the activations category
  double compute_s = 0;               // forward/backward/weight time over steps 2..N
  double steps_s = 0;                 // wall time of steps 2..N
};

}  // namespace mt::train
