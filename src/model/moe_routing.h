// The router of a mixture-of-experts layer (docs/moe.md): from the router's logits to each
// token's top-k experts and their combine weights, the capacity's dropped assignments, and
// the expert-sorted order the grouped GEMMs run in; and the gradient back to the logits,
// with the balancing losses' (Switch auxiliary loss, ST-MoE z-loss). Plain loops over
// tokens, deterministic: ties go to the lower expert index, then to the earlier token.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace mt::model {

// One microbatch's routing, in caller-owned buffers (n tokens, e experts, top k).
struct Routing {
  int64_t n = 0, e = 0, k = 0;
  float* probs = nullptr;     // [n, e] softmax of the logits over all experts
  float* lse = nullptr;       // [n] log-sum-exp of the logits (the z-loss's)
  int32_t* expert = nullptr;  // [n, k] the chosen experts, best first
  float* gate = nullptr;      // [n, k] their combine weights
  int32_t* slot = nullptr;    // [n, k] the assignment's row in the expert-sorted order; -1: dropped
  int32_t* order = nullptr;   // [n·k] row r holds assignment t·k + j (the first `kept` rows)
  std::vector<int64_t>* counts = nullptr;  // [e] rows per expert after the capacity (kept)
  std::vector<int64_t>* routed = nullptr;  // [e] assignments per expert before it
  int64_t kept = 0;
};

struct RouteOptions {
  RouterOrder order = RouterOrder::kSoftmaxTopK;
  // Tokens per expert = ceil(capacity_factor · n · k / e); over that, the assignments with
  // the lowest router probability are dropped (ties: the later token). 0: dropless.
  double capacity_factor = 0;
  // DeepSeek-V3's auxiliary-loss-free balancing: added to the probabilities for choosing
  // the experts only, never to the combine weights. Null: none.
  const float* selection_bias = nullptr;
  // Routing replay (model/routing_tape.h): the chosen experts [n·k] and which assignments
  // the capacity dropped [n·k] (1: dropped) taken as given instead of decided here; the
  // combine weights still come from these logits. Null: decide.
  const int32_t* forced_expert = nullptr;
  const uint8_t* forced_dropped = nullptr;
};

// Tokens one expert may take: ceil(capacity_factor · n · k / e), or n·k when dropless.
int64_t expert_capacity(double capacity_factor, int64_t n, int64_t k, int64_t e);

// Fills r from logits [n, e].
void route(Routing& r, const float* logits, const RouteOptions& o);

// The capacity's decision over a whole microbatch whose assignments are given one by one:
// expert[a] and prob[a] (the router probability of that expert for assignment a's token),
// a = token·k + j in the microbatch's order. Per expert, by descending probability (ties: the
// earlier assignment), those past expert_capacity(capacity_factor, n, k, e) get dropped[a] = 1.
// route's own rule; context parallelism decides with it on the gathered pieces (moe.cpp).
void capacity_drops(uint8_t* dropped, const int32_t* expert, const float* prob, int64_t n,
                    int64_t k, int64_t e, double capacity_factor);

// The balancing losses of one microbatch, before their coefficients: Switch's
// E·Σᵢ fᵢ·Pᵢ (fᵢ the share of the n·k assignments routed to expert i, Pᵢ the mean router
// probability of i; 1 when perfectly balanced) and the z-loss's mean of lse².
struct BalanceLosses {
  double aux = 0, z = 0;
};
BalanceLosses balance_losses(const Routing& r);

// What the balancing losses are made of, summable over ranks that hold parts of one
// microbatch (context parallelism: each cp rank routes its piece of every sequence): the
// assignments routed to each expert, each expert's summed probability, Σ lse², tokens.
struct BalanceSums {
  std::vector<double> routed, psum;  // [e]
  double zsum = 0;
  int64_t n = 0;
};
BalanceSums balance_sums(const Routing& r);
BalanceLosses balance_losses(const BalanceSums& s, int64_t k);

// d(logits) [n, e] (overwritten) from d(gates) [n, k], plus aux_coef · d(aux)/d(logits) and
// z_coef · d(z)/d(logits) (the coefficients already multiplied by the loss's weight).
// `whole` (cp): the microbatch's sums over all its pieces, which the losses were computed
// from (null: this routing's own).
void route_backward(float* dlogits, const float* dgate, const Routing& r, double aux_coef,
                    double z_coef, const BalanceSums* whole = nullptr);

}  // namespace mt::model
