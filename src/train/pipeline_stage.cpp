#include "train/pipeline_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "obs/trace.h"
#include "train/trainer.h"

namespace mt::train {

namespace pp = parallel::pp;

// The split's costs: pp::gpt_chunk_costs (shared with the planner).
pp::Partition make_partition(const TrainOptions& o, int chunks) {
  const model::GptConfig& c = o.model;
  const pp::ChunkCosts k = pp::gpt_chunk_costs(static_cast<int>(c.n_layer), double(c.d_model),
                                               double(c.seq_len), double(c.padded_vocab()));
  if (!o.pipeline.layers.empty())
    return pp::explicit_partition(pp::parse_layer_counts(o.pipeline.layers), k.layer, k.first_extra,
                                  k.last_extra, chunks);
  return pp::balanced_partition(k.layer, k.first_extra, k.last_extra, chunks);
}

model::StageParts stage_parts(const pp::Schedule& s, const pp::Partition& part, int pp_rank) {
  model::StageParts parts;
  parts.all_layers = false;
  for (int ch : s.chunks_of_rank(pp_rank))
    for (int l = part.first[ch]; l < part.first[ch + 1]; ++l) parts.layers.push_back(l);
  std::sort(parts.layers.begin(), parts.layers.end());
  parts.embedding = pp_rank == s.rank_of_chunk(0);
  parts.head = pp_rank == s.rank_of_chunk(s.num_chunks() - 1);
  return parts;
}

PipelineStage::PipelineStage(model::Gpt& gpt, const pp::Schedule& s, const pp::Partition& part,
                             int pp_rank, int64_t microbatch_size)
    : gpt_(gpt),
      s_(s),
      part_(part),
      rank_(pp_rank),
      chunks_(s.chunks_of_rank(pp_rank)),
      chunk_k0_(static_cast<size_t>(s.num_chunks()), -1),
      B_(microbatch_size),
      T_(gpt.local_seq_len()) {
  // The rank's blocks are its chunks' layers in ascending order: chunk c's first local
  // block is the number of the rank's layers in its earlier chunks.
  int k = 0;
  for (int ch : chunks_) {
    chunk_k0_[static_cast<size_t>(ch)] = k;
    k += part.layers[ch];
    max_layers_ = std::max(max_layers_, part.layers[ch]);
  }
  MT_ASSERT(k == gpt.num_blocks());
  has_head_ = gpt.parts().head;
  // The plan's buffers, all allocated now: growing the pool in a later step would allocate
  // in the steady state.
  plan_ = pp::plan_buffers(s);
  for (int i = 0; i < plan_.buffers[static_cast<size_t>(pp_rank)]; ++i) grow();
}

int64_t PipelineStage::rows() const { return gpt_.tp().local_rows(B_ * T_); }

void PipelineStage::grow() {
  const int64_t before = mem::current_tracker().snapshot().of(mem::Category::kActivations);
  Slot s;
  s.acts = gpt_.make_activations(B_, T_, max_layers_, has_head_, s_.split_backward());
  s.dinput =
      Tensor::empty({rows(), gpt_.config().d_model}, DType::kF32, mem::Category::kActivations);
  pool_.push_back(std::move(s));
  buffer_bytes_ = mem::current_tracker().snapshot().of(mem::Category::kActivations) - before;
}

// The plan's buffer of (mb, chunk): held, or released with its input gradient's send still
// to be posted.
PipelineStage::Slot& PipelineStage::find(int mb, int chunk) {
  const int slot = plan_.slot_of(rank_, mb, chunk);
  Slot* s = slot >= 0 ? &pool_[static_cast<size_t>(slot)] : nullptr;
  if (!s || s->mb != mb || s->chunk != chunk)
    fail_run("pipeline stage {}: no buffer holds microbatch {} of chunk {}", rank_, mb, chunk);
  return *s;
}

// The plan's buffer for (mb, chunk). Its earlier sends' receives were issued before this
// point in the plan's walk, so waiting for them needs nothing more from any rank.
PipelineStage::Slot& PipelineStage::acquire(int mb, int chunk) {
  const int slot = plan_.slot_of(rank_, mb, chunk);
  MT_ASSERT(slot >= 0);
  Slot& s = pool_[static_cast<size_t>(slot)];
  if (s.held && s.mb == mb && s.chunk == chunk) return s;  // taken at its receive
  MT_ASSERT(!s.held);
  // poll first: on nccl a wait would also issue this exchange's operations posted so far.
  for (auto& w : s.sends)
    if (!w->poll()) w->wait();
  s.sends.clear();
  s.mb = mb;
  s.chunk = chunk;
  s.held = true;
  held_peak_ = std::max(held_peak_, ++held_);
  return s;
}

void PipelineStage::release(Slot& s) {
  s.held = false;
  --held_;
}

// A chunk's output: its last block's, or the embedding's where the first chunk holds no layer.
const Tensor& PipelineStage::output_of(Slot& s) const {
  const int n = part_.layers[s.chunk];
  return n == 0 ? s.acts.encoded : s.acts.blocks[static_cast<size_t>(n - 1)].out;
}

void PipelineStage::begin_step(const SequenceSampler* data, int64_t first_sample, float dloss) {
  data_ = data;
  first_sample_ = first_sample;
  dloss_ = dloss;
  loss_sum_ = 0;
  for (Slot& s : pool_) {  // no tag from the last step can match; its sends are done
    s.mb = s.chunk = -1;
    s.sends.clear();
  }
}

void PipelineStage::compute(const pp::Action& a) {
  switch (a.kind) {
    case pp::ActionKind::kForward:
      forward(a.microbatch, a.chunk);
      break;
    case pp::ActionKind::kBackward:
      backward(a.microbatch, a.chunk, model::BackwardPart::kAll);
      break;
    case pp::ActionKind::kBackwardInput:
      backward(a.microbatch, a.chunk, model::BackwardPart::kInput);
      break;
    case pp::ActionKind::kBackwardWeight:
      weight(a.microbatch, a.chunk);
      break;
    default:
      MT_ASSERT(!"not a compute action");
  }
}

comm::Buf PipelineStage::recv_buffer(const pp::Action& a) {
  if (a.kind == pp::ActionKind::kRecvAct)
    return comm::Buf(acquire(a.microbatch, a.chunk).acts.encoded);
  return comm::Buf(find(a.microbatch, a.chunk).dinput);
}

comm::Buf PipelineStage::send_buffer(const pp::Action& a) {
  Slot& s = find(a.microbatch, a.chunk);
  if (a.kind == pp::ActionKind::kSendGrad) return comm::Buf(s.dinput);
  return comm::Buf(output_of(s));
}

void PipelineStage::sent(const pp::Action& a, const comm::WorkPtr& w) {
  find(a.microbatch, a.chunk).sends.push_back(w);
}

void PipelineStage::fill_batch(Slot& s, int mb) {
  s.acts.routing_sample = first_sample_ + mb * B_;
  data_->fill(first_sample_ + mb * B_, B_, s.acts.tokens.data(), s.acts.targets.data(),
              gpt_.local_positions());
}

void PipelineStage::forward(int mb, int chunk) {
  Slot& s = acquire(mb, chunk);
  if (chunk == 0 || is_last(chunk)) fill_batch(s, mb);
  if (chunk == 0) gpt_.embed_forward(s.acts);  // else the input was received
  gpt_.blocks_forward(s.acts, chunk_k0_[static_cast<size_t>(chunk)], part_.layers[chunk]);
  if (is_last(chunk)) loss_sum_ += gpt_.head_forward(s.acts);
}

void PipelineStage::backward(int mb, int chunk, model::BackwardPart part) {
  Slot& s = find(mb, chunk);
  float* dres = s.dinput.f32();  // received d(output), unless this is the last chunk
  s.acts.dloss = dloss_;
  if (is_last(chunk)) gpt_.head_backward(s.acts, dloss_, dres, part);
  gpt_.blocks_backward(s.acts, chunk_k0_[static_cast<size_t>(chunk)], part_.layers[chunk], dres,
                       part);
  if (part == model::BackwardPart::kInput) return;  // W follows, in the same buffer
  if (chunk == 0) gpt_.embed_backward(s.acts, dres);
  release(s);
}

void PipelineStage::weight(int mb, int chunk) {
  Slot& s = find(mb, chunk);
  gpt_.blocks_backward(s.acts, chunk_k0_[static_cast<size_t>(chunk)], part_.layers[chunk], nullptr,
                       model::BackwardPart::kWeight);
  if (is_last(chunk)) gpt_.head_weight_backward(s.acts);
  if (chunk == 0) gpt_.embed_backward(s.acts, s.dinput.f32());
  release(s);
}

double PipelineStage::forward_only(comm::Group& pp_group, const SequenceSampler& data,
                                   int64_t first_sample, int microbatches) {
  // Every rank walks the chunks in model order; consecutive chunks live on different ranks
  // (pp > 1), so each send meets the receive its neighbour is already waiting in.
  constexpr int kEvalTag = 1 << 20;
  Slot& s = pool_.front();  // between steps every buffer is free and its sends done
  MT_ASSERT(!s.held);
  s.sends.clear();
  s.held = true;
  held_peak_ = std::max(held_peak_, ++held_);
  s.acts.routing_sample = -1;  // validation routes on its own (no tape)
  double sum = 0;
  for (int mb = 0; mb < microbatches; ++mb)
    for (int ch : chunks_) {
      if (ch == 0 || is_last(ch))
        data.fill(first_sample + mb * B_, B_, s.acts.tokens.data(), s.acts.targets.data(),
                  gpt_.local_positions());
      if (ch == 0)
        gpt_.embed_forward(s.acts);
      else
        pp_group.recv(comm::Buf(s.acts.encoded), s_.rank_of_chunk(ch - 1), kEvalTag + ch);
      s.chunk = ch;
      gpt_.blocks_forward(s.acts, chunk_k0_[static_cast<size_t>(ch)], part_.layers[ch]);
      if (is_last(ch))
        sum += gpt_.head_forward(s.acts);
      else
        pp_group.send(comm::Buf(output_of(s)), s_.rank_of_chunk(ch + 1), kEvalTag + ch + 1);
    }
  release(s);
  s.mb = s.chunk = -1;
  return sum;
}

// ---- trace --------------------------------------------------------------------------

namespace {
const char* category_of(pp::ActionKind k) {
  switch (k) {
    case pp::ActionKind::kForward:
      return "forward";
    case pp::ActionKind::kBackward:
    case pp::ActionKind::kBackwardInput:
      return "backward";
    case pp::ActionKind::kBackwardWeight:
      return "weight";
    case pp::ActionKind::kSendAct:
    case pp::ActionKind::kSendGrad:
      return "send";
    default:
      return "recv";
  }
}
}  // namespace

void write_pipeline_trace(comm::Group& world, int row, const std::vector<PipelineTraceEvent>& mine,
                          const std::string& path) {
  // 6 floats per event: row, kind (+ 8 for a receive that blocked), microbatch, chunk,
  // start, duration.
  std::vector<float> packed;
  for (const PipelineTraceEvent& e : mine)
    packed.insert(packed.end(),
                  {static_cast<float>(row),
                   static_cast<float>(static_cast<int>(e.action.kind) + (e.wait ? 8 : 0)),
                   static_cast<float>(e.action.microbatch), static_cast<float>(e.action.chunk),
                   static_cast<float>(e.start_s), static_cast<float>(e.dur_s)});
  float n_mine = static_cast<float>(packed.size());
  std::vector<float> counts_f(static_cast<size_t>(world.size()));
  world.all_gather(comm::Buf(&n_mine, 1),
                   comm::Buf(counts_f.data(), static_cast<int64_t>(counts_f.size())));
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (float c : counts_f) {
    counts.push_back(static_cast<int64_t>(c));
    total += counts.back();
  }
  std::vector<float> all(static_cast<size_t>(total));
  world.all_gather(comm::Buf(packed.data(), static_cast<int64_t>(packed.size())),
                   comm::Buf(all.data(), total), counts);
  if (world.rank() != 0) return;
  std::vector<obs::TraceEvent> events;
  int rows = 0;
  for (size_t i = 0; i + 6 <= all.size(); i += 6) {
    const int code = static_cast<int>(all[i + 1]);
    const bool wait = code >= 8;
    pp::Action a{static_cast<pp::ActionKind>(code % 8), static_cast<int>(all[i + 2]),
                 static_cast<int>(all[i + 3]), -1};
    const std::string name = fmt::format("{}{}{}.{}", wait ? "wait " : "",
                                         pp::action_kind_name(a.kind), a.microbatch, a.chunk);
    rows = std::max(rows, static_cast<int>(all[i]) + 1);
    events.push_back({static_cast<int>(all[i]), name, wait ? "idle" : category_of(a.kind),
                      all[i + 4], all[i + 5]});
  }
  obs::write_chrome_trace(path, events, std::max(rows, world.size()));
}

}  // namespace mt::train
