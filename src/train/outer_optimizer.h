// DiLoCo-style training across slow links (Douillard et al. 2023, "DiLoCo: Distributed
// Low-Communication Training of Language Models"; docs/diloco.md).
//
// The dp dimension is split into S sites of dp / S ranks each. Inside a site everything is
// as in synchronous training: its ranks reduce gradients (and ZeRO shards the optimizer
// state, the gradients or the parameters) over the site's dp (x cp) group only, and each site
// takes H inner AdamW steps on its own share of every global batch. Then the outer step: the
// sites average their pseudo-gradients Δ = θ_outer - θ_site over the cross-site group only
// (the ranks at the same position of every site: same tp, pp and cp coordinates, same shard),
// the outer optimizer applies the mean, and every site continues from the new outer
// parameters. Each rank keeps the outer state of its own shard of the site's flat parameters
// (under ZeRO-0 the shard of the site's dp group too, gathered over the site after the step),
// so the outer exchange moves the parameters once per site, whatever the layout inside it.
// With --ep the site's ep ranks hold the same dense parameters (their gradients are summed
// over the ep ranks): each ep rank sends its 1/E slice of them across sites, with its own
// experts, and the ep ranks then gather the slices' means inside the site, so the dense
// parameters too cross sites once.
//
// Outer optimizers (per element, Δ̄ the mean pseudo-gradient):
//   nesterov  m <- μ m + Δ̄;  θ <- θ - lr (Δ̄ + μ m)        (PyTorch SGD, nesterov=True)
//   average   θ <- θ - lr Δ̄ (lr 1: plain parameter averaging; uncompressed, the sites
//             all-reduce their parameters and θ <- mean θ_site exactly, so one site or H = 1
//             with one site is bitwise synchronous training)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "core/tensor.h"
#include "train/checkpoint.h"
#include "train/outer_compress.h"
#include "train/outer_options.h"

namespace mt::train {

struct Replica;
struct TrainOptions;

// The site-level groups carved from a replica group (dp, or dp x cp). Collective over it.
class Sites {
 public:
  // dp_rank / dp_size: the rank's dp coordinate and the dp size; cp likewise (cp_size 1: the
  // replica group is dp alone). Site k holds dp ranks [k·dp/S, (k+1)·dp/S).
  // With --ep the replica group is the expert-dp group (x cp) and dp_rank / dp_size its dp
  // coordinate and size; ep_rank names the experts the rank holds (for the observer).
  Sites(comm::Group& replica, int sites, int dp_rank, int dp_size, int cp_rank, int cp_size,
        int ep_rank = 0, int ep_size = 1);
  comm::Group& inner() { return *inner_; }  // the site's dp (x cp) group: gradients, ZeRO
  comm::Group& cross() { return *cross_; }  // the same position in every site: the outer step
  int site() const { return site_; }
  int count() const { return count_; }
  int position() const { return inner_->rank(); }
  int ep_rank() const { return ep_rank_; }
  int job_dp() const { return job_dp_; }  // the job's --dp (ep and cp ranks not counted twice)
  // Bytes this rank has received over the cross-site group (the flight recorder's count).
  int64_t outer_recv_bytes();

 private:
  int site_ = 0, count_ = 1, ep_rank_ = 0, job_dp_ = 1;
  std::unique_ptr<comm::Group> inner_, cross_;
};

class OuterOptimizer : public ckpt::Extension {
 public:
  OuterOptimizer(const OuterOptions& o, Replica& rep, Sites& sites, int world_rank);

  // After the checkpoint (if any) and --init-from are loaded: a run that did not resume
  // outer state starts a round from the replica's parameters (momentum 0).
  void begin();
  // --outer-warmup-steps: before the optimizer step of (0-based) `step`, while it is a
  // warm-up step, the site's reduced gradients (this rank's optimizer range, the same range
  // at every site) averaged over the cross-site group: synchronous dp over all sites.
  void average_gradients(int64_t step, float* grads, int64_t n);
  bool warming_up(int64_t step) const { return step < opts_.warmup; }
  // After inner step `done` (1-based) of a run of `total`: the outer step of each fragment
  // whose round is complete (fragment p after inner steps W + (p + 1) H / F + k H, W the
  // warm-up steps; every fragment after the last step; none before W + 1), collective over the
  // cross-site group, then the site's group. Returns whether any stepped.
  bool after_inner_step(int64_t done, int64_t total);
  // Inner steps since the last fragment's outer step (one fragment: since the outer step).
  int64_t round_step() const { return round_step_; }
  int64_t rounds() const { return rounds_; }  // outer steps taken (of any fragment)

  // Checkpoints: every rank writes its outer state and its site's model state of its range;
  // only site 0's ranks put their model into the checkpoint's pieces.
  bool saves_model() const override { return sites_.site() == 0; }
  void save(const std::string& tmp_dir, int64_t step) override;
  void load(const std::string& dir, int64_t step) override;

 private:
  float* site_values();
  int64_t fragment_offset(int p) const;   // (p + 1) H / F
  int64_t chunk_of(int64_t elems) const;  // compressed: elements per site's chunk
  // fn(i, k) for each element i of fragment p (shard-relative) at packed index k: with --ep
  // the ep rank's own (expert) elements first, then the dense ones its ep ranks share.
  template <typename Fn>
  void each(int p, Fn&& fn) const;
  // Fragment p's packed values d (packed_len(p) floats) summed over the sites from this ep
  // rank's part, [0, sent_len(p)) after move_slice: the sum there, the rest still to gather.
  void split_shared(Replica& rep);
  int64_t packed_len(int p) const;
  int64_t sent_len(int p) const;
  void move_slice(int p, float* d) const;  // --ep: this rank's dense slice after its own
  void gather_slices(int p, float* d);     // --ep: every ep rank's slice, in place
  void exchange(int p, float* d);          // the mean over the sites, d[0, packed_len(p))
  void step_fragment(int p);
  void apply_mean(int p, const float* d);  // the outer optimizer on the mean pseudo-gradient
  void start_fragment(int p);              // --outer-delay: the exchange started
  void land_fragment(int p);               // --outer-delay: waited for, applied, mixed
  bool exchange_in_flight() const;
  void exchange_compressed(int64_t elems);
  void publish();  // the new values to the site's other ranks and to the bf16 copy

  OuterOptions opts_;
  OuterCompress compress_;
  Replica& rep_;
  Sites& sites_;
  int world_rank_;
  int64_t lo_ = 0, n_ = 0;  // the shard [lo, lo + n) of the site's flat parameters
  // Per fragment: its element ranges relative to lo, and their count.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> segs_;
  std::vector<int64_t> frag_elems_;
  // --ep (E > 1): per fragment its segments in packing order (the rank's experts, then the
  // dense elements its ep ranks share), the experts' count and the dense slice each ep rank
  // sends (ceil(dense / E)). Without ep every element is the rank's own.
  comm::Group* shared_ = nullptr;  // the site's ep ranks at this position
  std::vector<std::vector<std::pair<int64_t, int64_t>>> order_;
  std::vector<int64_t> own_elems_, slice_elems_;
  Tensor gathered_;
  Tensor outer_, momentum_, buf_, before_;
  Tensor send_words_, recv_words_, mine_;  // compressed exchange
  // --outer-delay: per fragment its region of pend_ (the pseudo-gradient being summed), the
  // exchange in flight and the inner step (after the warm-up) at which it lands.
  Tensor pend_;
  std::vector<int64_t> pend_off_, lands_;
  std::vector<comm::WorkPtr> inflight_;
  Tensor sent_, now_;  // the observer's: the site's values sent and before mixing
  int64_t round_step_ = 0, rounds_ = 0;
  bool loaded_ = false;
};

// Why the checkpoint in `dir` (of `step` steps) cannot be resumed by a run of `o` as far as
// DiLoCo goes (its site count, dp, H; DiLoCo state resumed by synchronous training; a
// synchronous checkpoint past the DiLoCo run's warm-up); "" if it can. A synchronous
// checkpoint of step <= --outer-warmup-steps starts the sites as their own warm-up would.
std::string outer_resume_refusal(const std::string& dir, int64_t step, const TrainOptions& o);

// S / (B·T): the factor of the loss gradient that makes each site's gradient the mean over
// its own sequences (1 / (B·T) without sites, bitwise today's).
float outer_grad_scale(const OuterOptions& o, int64_t batch_tokens);

}  // namespace mt::train
