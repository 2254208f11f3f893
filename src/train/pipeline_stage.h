// One rank's part of a pipeline (docs/pipeline.md): the pp::Stage the executor drives. It
// runs the pieces of the rank's Gpt (embedding, chunks of blocks, head) for one
// (microbatch, chunk) at a time, in activation buffers ("slots") allocated before the first
// step as the schedule's buffer plan says (parallel/pipeline/buffers.h: how many, and which
// one each (microbatch, chunk) takes).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "parallel/pipeline/buffers.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "train/pipeline_options.h"
#include "train/token_corpus.h"

namespace mt::train {

struct TrainOptions;

// The layers of each chunk: --pp-layers, or balanced by estimated cost.
parallel::pp::Partition make_partition(const TrainOptions& o, int chunks);
// What pipeline rank `pp_rank` holds: its chunks' blocks, the embeddings if it runs chunk 0,
// the head if it runs the last chunk.
model::StageParts stage_parts(const parallel::pp::Schedule& s, const parallel::pp::Partition& part,
                              int pp_rank);

class PipelineStage final : public parallel::pp::Stage {
 public:
  PipelineStage(model::Gpt& gpt, const parallel::pp::Schedule& s,
                const parallel::pp::Partition& part, int pp_rank, int64_t microbatch_size);

  // Per step: where the samples come from, the loss scale; loss_sum() is the sum of the
  // microbatches' mean losses (last stage; 0 elsewhere).
  void begin_step(const SequenceSampler* data, int64_t first_sample, float dloss);
  double loss_sum() const { return loss_sum_; }
  // Validation: `microbatches` forwards in model order, activations passed on with blocking
  // send/recv over `pp_group`; returns the summed mean losses (last stage; 0 elsewhere).
  double forward_only(comm::Group& pp_group, const SequenceSampler& data, int64_t first_sample,
                      int microbatches);

  void compute(const parallel::pp::Action& a) override;
  comm::Buf recv_buffer(const parallel::pp::Action& a) override;
  comm::Buf send_buffer(const parallel::pp::Action& a) override;
  void sent(const parallel::pp::Action& a, const comm::WorkPtr& w) override;

  const std::vector<int>& chunks() const { return chunks_; }
  int pool_buffers() const { return static_cast<int>(pool_.size()); }
  int held_peak() const { return held_peak_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  struct Slot {
    int mb = -1, chunk = -1;
    bool held = false;
    model::Activations acts;  // encoded = the chunk's input
    Tensor dinput;            // d(chunk output) received, turned into d(chunk input) in place
    std::vector<comm::WorkPtr> sends;
  };
  Slot& find(int mb, int chunk);
  Slot& acquire(int mb, int chunk);
  void release(Slot& s);
  void grow();
  int64_t rows() const;
  bool is_last(int chunk) const { return chunk == s_.num_chunks() - 1; }
  const Tensor& output_of(Slot& s) const;
  void fill_batch(Slot& s, int mb);
  void forward(int mb, int chunk);
  void backward(int mb, int chunk, model::BackwardPart part);
  void weight(int mb, int chunk);

  model::Gpt& gpt_;
  const parallel::pp::Schedule& s_;
  const parallel::pp::Partition& part_;
  int rank_;
  std::vector<int> chunks_;
  std::vector<int> chunk_k0_;  // by global chunk: its first local block index (-1: not here)
  int64_t B_, T_;
  int max_layers_ = 0;
  bool has_head_ = false;
  parallel::pp::BufferPlan plan_;
  std::deque<Slot> pool_;
  int held_ = 0, held_peak_ = 0;
  int64_t buffer_bytes_ = 0;
  const SequenceSampler* data_ = nullptr;
  int64_t first_sample_ = 0;
  float dloss_ = 0;
  double loss_sum_ = 0;
};

// The Chrome/Perfetto trace of the pipeline: each rank's events (row = its pipeline row)
// gathered over `world` to rank 0, which writes `path`.
struct PipelineTraceEvent {
  parallel::pp::Action action;
  bool wait = false;
  double start_s = 0, dur_s = 0;
};
void write_pipeline_trace(comm::Group& world, int row, const std::vector<PipelineTraceEvent>& mine,
                          const std::string& path);

}  // namespace mt::train
