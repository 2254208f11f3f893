// The flags of DiLoCo-style training (docs/diloco.md): --sites, --outer-every,
// --outer-optimizer, --outer-lr, --outer-momentum, --outer-compress,
// --outer-fragments, --outer-warmup-steps, --outer-delay, --outer-mix. Kept apart from
// outer_optimizer.h so that TrainOptions holds them without pulling in the machinery.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mt::train {

// One rank's view of an outer step, for tests: its piece [lo, lo + elems) of the flat
// parameters (the rank's shard within its site) before and after, and its site's parameters
// after the round's inner steps.
struct OuterStepView {
  int64_t round = 0;  // 1, 2, ... (every fragment's outer step counts)
  int fragment = 0;   // --outer-fragments: the fragment stepped (the others are unchanged)
  int site = 0;
  int position = 0;  // the rank's index within its site (dp x cp)
  int ep_rank = 0;   // --ep: the rank's experts (its site's ranks at one position differ in it)
  int64_t lo = 0, elems = 0;
  // The fragment's elements: [a, b) ranges relative to lo.
  const std::vector<std::pair<int64_t, int64_t>>* ranges = nullptr;
  const float* outer_before = nullptr;
  const float* site_values = nullptr;
  const float* outer_after = nullptr;
  // The site's values the pseudo-gradient was taken from (--outer-delay: τ inner steps
  // before site_values; otherwise site_values), and the site's values after the outer step
  // (α site_values + (1 - α) outer_after with --outer-delay; otherwise outer_after).
  const float* site_sent = nullptr;
  const float* site_after = nullptr;
};

struct OuterOptions {
  int sites = 0;       // --sites S: the dp dimension split into S sites; 0: off (synchronous dp)
  int64_t every = 50;  // --outer-every H: inner steps per outer round
  std::string optimizer = "nesterov";  // nesterov or average
  float lr = 0.7f;                     // DiLoCo's outer learning rate and momentum
  float momentum = 0.9f;
  std::string compress = "none";  // none, bf16, int8 (train/outer_compress.h)
  // Streaming DiLoCo: the model's units in F fragments, fragment p stepped after inner steps
  // (p + 1) H / F + k H; 1: all at once.
  int fragments = 1;
  // --outer-warmup-steps W: the first W steps are synchronous data parallelism over all
  // sites (each site's gradient averaged over the cross-site group before its AdamW step),
  // the first outer round starts after step W (DiLoCo's protocol: a synchronously
  // pretrained start). 0: rounds from step 0.
  int64_t warmup = 0;
  // --outer-delay τ (streaming DiLoCo's overlap): a fragment's exchange is started at its
  // inner step and waited for τ inner steps later, the inner steps running meanwhile; the
  // site then mixes: θ_site <- α θ_site + (1 - α) θ_outer, α = --outer-mix. 0: blocking.
  int64_t delay = 0;
  float mix = 0.5f;
  std::function<void(const OuterStepView&)> observer;  // tests: after every outer step

  bool on() const { return sites > 0; }
  int site_count() const { return sites > 0 ? sites : 1; }
};

// Refuses (exit 2) a combination that cannot run, naming the value and the fix.
void check_outer_options(const OuterOptions& o, int dp, const std::string& device, int n_layer,
                         int ep, int64_t steps);

}  // namespace mt::train
