// The planner's Mixture-of-Experts arithmetic (docs/planner.md, "Mixture of experts"):
// expert parallelism folded into dp × cp, the all-to-all of dispatch and combine on the
// fabric the ep group spans, the MLP as the GEMM and activation models see it, and the
// model states of dense and expert parameters sharded over their own data-parallel groups.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {

// The job as one layer's GEMM and activation models see it: a MoE model's MLP as a dense
// one of the width a token passes through (ModelSpec::active_ff), the busiest expert's load
// (Job::expert_load) applied when the experts are spread over ep > 1 ranks. A dense job is
// returned as it is.
Job compute_view(const Job& j, const Layout& l);

// The busiest ep rank's expert work over the mean, as its time sees it: Job::expert_load
// with ep > 1 (1 without). On a host whose cores the ranks share, the work beyond the mean
// runs while the lighter ranks wait at the all-to-all, their cores free: at the rank's cap
// (a core per thread) rather than its share of the host, so the excess counts
// share / cap of itself (ep 4 on 2 cores: half; bench/plan-vs-runtime cp-moe: +33% with the
// whole load, 1.79). On GPUs, or with no more ranks than cores, the whole load.
double compute_load(const Job& j, const Layout& l);

// The expert tensor-parallel size: how many tp ranks split each expert. Megatron-Core's
// default (expert_tensor_parallel_size unset, or before it existed) is tp: its alltoall
// dispatcher all-gathers the routed rows over tp after the all-to-all and reduce-scatters the
// experts' outputs before the return, plain collectives beside no GEMM (Layout::tp_comm_overlap
// chunks only the dense linears). Our runtime keeps the experts whole on every tp rank: 1.
// A dense model: 1.
int moe_expert_tp(const Job& j, const Layout& l);

// The ranks that hold the same experts and reduce their gradients (expert-dp): dp·cp / ep,
// times tp / moe_expert_tp under Megatron-Core (with expert tp 1 the tp ranks hold the same
// experts whole); our runtime's tp ranks hold whole experts but each reduces with its own
// (tp rank's) group, as its dense parameters: dp·cp / ep.
int expert_dp(const Job& j, const Layout& l);

// One rank's routed-expert parameters per block (averaged over the blocks): 1/ep of them,
// each split over moe_expert_tp ranks.
double expert_params_per_layer(const Job& j, const Layout& l);

// How many ranks of an ep group share a node. Our runtime: ep ranks cp·tp apart (its mesh
// order pp, dp, ep, cp, tp). Megatron-Core: expert-tp apart — it builds each ep group from
// the expert-tp-strided ranks of etp·ep consecutive ones, folding ep over cp and dp
// (initialize_model_parallel, before parallel folding as after): tp apart by default,
// neighbours with expert tp 1.
int ep_per_node(const Job& j, const Layout& l);

// One all-to-all in which every rank of the ep group holds `bytes` and keeps 1/ep of them:
// the in-node share over NVLink and the rest over the network at once (the slower sets the
// time), plus one latency per peer.
double ep_all_to_all_s(const Job& j, const Layout& l, double bytes);

// Per layer and microbatch, averaged over the blocks (moe_layers of n_layer have them):
// the dispatch and combine all-to-alls of the routed tokens (tokens · top_k · d_model,
// split over tp as Megatron-Core's sequence-parallel MoE does), forward 2, backward 2.
struct EpCosts {
  double fwd = 0, bwd = 0;
};
EpCosts ep_costs(const Job& j, const Layout& l);

// (kind, message) when the layout's ep cannot run: ep < 1, ep > 1 on a dense model, ep not
// dividing dp × cp or the expert count.
std::optional<std::pair<std::string, std::string>> ep_invalid(const Job& j, const Layout& l);

// Model states of `psi` parameters per rank, `expert_psi` of them routed experts: the dense
// ones sharded by ZeRO over dp × cp (Megatron-Core), or in our runtime over dp·cp / ep like
// the experts (it shards every state over the mesh's dp; docs/moe.md), the experts over
// expert_dp.
MemoryBytes ep_model_states(double psi, double expert_psi, const Job& j, const Layout& l);

// Our f32 runtime's MoE layer memory (model/moe.h MoeLayer::make_activations and
// make_scratch), for one microbatch on one rank: every tp rank routes all of its n = b·S/cp
// tokens; with ep the expert buffers hold what the rank's experts can receive, dropless,
// ep·n·min(k, E/ep) rows (parallel/expert.h max_received_rows). `block`: what one block
// keeps for backward — allocated in every block of a model with MoE blocks, dense ones
// included; `scratch`: the rank's, shared by its layers.
struct OurMoeBytes {
  double block = 0, scratch = 0;
};
OurMoeBytes our_moe_bytes(const Job& j, const Layout& l);

// Our runtime with ep: the dense parameters' gradients are summed over the ep ranks from one
// packed buffer (train/replica.cpp ep_sync: the dense ranges of the rank's optimizer range),
// `dense_params` per rank; with ZeRO the optimizer range is the rank's shard of `psi`, so
// at most min(dense, psi / (dp·cp/ep)) (an upper bound: where the shard cuts the dense
// ranges depends on the parameters' order).
double our_ep_pack_bytes(const Layout& l, double psi, double dense_params);

// The ep sizes the search tries for dp × cp ranks: 1 for a dense model, else every divisor
// of dp·cp that divides the expert count.
std::vector<int> ep_choices(const Job& j, int dp, int cp);

}  // namespace mt::plan
