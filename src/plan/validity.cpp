// Whether a layout can run (plan::invalid_reason): every refusal with its numbers and, for
// the search's counts, its kind (docs/planner.md "Commands": why the rest were dropped).
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "plan/moe.h"
#include "plan/planner.h"
#include "plan/stages.h"

namespace mt::plan {

std::optional<std::string> invalid_reason(const Job& j, const Layout& l, std::string* kind) {
  // The message (with this layout's numbers) and, for the search's counts, its kind: a fixed
  // text that every layout refused for the same reason shares.
  auto refuse = [kind](const char* k, std::string message) {
    if (kind) *kind = k;
    return std::optional<std::string>(std::move(message));
  };
  const ModelSpec& m = j.model;
  const int64_t world = int64_t(l.dp) * l.tp * l.pp * l.cp;
  if (world != j.gpus)
    return refuse("dp x tp x pp x cp is not the GPU count",
                  fmt::format("dp {} x tp {} x pp {} x cp {} = {} is not --gpus {}", l.dp, l.tp,
                              l.pp, l.cp, world, j.gpus));
  if (auto ep = ep_invalid(j, l)) return refuse(ep->first.c_str(), ep->second);
  if (l.tp > j.cluster.gpus_per_node)
    return refuse("tp exceeds a node", fmt::format("tp {} exceeds the {} GPUs of a node", l.tp,
                                                   j.cluster.gpus_per_node));
  if (!tp_fits_nodes(j, l.tp))
    return refuse(
        "tp does not divide a node",
        fmt::format(
            "tp {} does not divide the {} GPUs of a node: tp groups of consecutive ranks would "
            "straddle two nodes (choose a divisor of {})",
            l.tp, j.cluster.gpus_per_node, j.cluster.gpus_per_node));
  if (m.n_head % l.tp != 0) {
    std::string ok;
    for (int t = 1; t <= j.cluster.gpus_per_node && t <= m.n_head; ++t)
      if (m.n_head % t == 0 && tp_fits_nodes(j, t))
        ok += (ok.empty() ? "" : ", ") + std::to_string(t);
    return refuse(
        "tp does not divide n_head",
        fmt::format("tp {} does not divide n_head {} (choose one of {})", l.tp, m.n_head, ok));
  }
  if (m.n_kv_head % l.tp != 0 && l.tp % m.n_kv_head != 0)
    return refuse("tp and n_kv_head do not divide each other",
                  fmt::format("tp {} does not divide n_kv_head {}", l.tp, m.n_kv_head));
  if (m.d_ff % l.tp != 0)
    return refuse("tp does not divide d_ff",
                  fmt::format("tp {} does not divide d_ff {}", l.tp, m.d_ff));
  // --pp-layers may leave the first and the last chunk without a layer (train's
  // pp::explicit_partition): two chunks more than layers.
  const int64_t empty_ends = !l.pp_layers.empty() && int64_t(l.pp) * l.virtual_stages > 1 ? 2 : 0;
  if (m.n_layer + empty_ends < int64_t(l.pp) * l.virtual_stages)
    return refuse("more pipeline chunks than layers",
                  fmt::format("pp {} x virtual stages {} exceeds n_layer {}", l.pp,
                              l.virtual_stages, m.n_layer));
  if (!l.pp_layers.empty()) {
    const int64_t chunks = int64_t(l.pp) * l.virtual_stages;
    int64_t sum = 0;
    for (int n : l.pp_layers) sum += n;
    if (int64_t(l.pp_layers.size()) != chunks)
      return refuse(
          "--pp-layers has another chunk count",
          fmt::format("--pp-layers has {} entries but pp {} x virtual stages {} = {} chunks",
                      l.pp_layers.size(), l.pp, l.virtual_stages, chunks));
    for (size_t c = 0; c < l.pp_layers.size(); ++c) {
      const bool end = chunks > 1 && (c == 0 || c + 1 == l.pp_layers.size());
      if (l.pp_layers[c] < (end ? 0 : 1))
        return refuse("--pp-layers has an empty chunk",
                      fmt::format("--pp-layers: chunk {} has {} layers; every chunk but the first "
                                  "and the last (the embedding or the LM head alone) needs one",
                                  c, l.pp_layers[c]));
    }
    if (sum != m.n_layer)
      return refuse("--pp-layers does not cover n_layer",
                    fmt::format("--pp-layers covers {} layers but n_layer is {}", sum, m.n_layer));
  }
  if (l.cp > 1 && j.seq % (2 * l.cp) != 0)
    return refuse("cp does not split seq into chunks",
                  fmt::format("cp {} does not divide seq {} in 2·cp chunks", l.cp, j.seq));
  if (l.cp_comm != "ring" && l.cp_comm != "all-gather" && l.cp_comm != "a2a")
    return refuse("no such cp exchange",
                  fmt::format("--cp-comm '{}' (choose ring, all-gather or a2a)", l.cp_comm));
  // As train refuses it (parallel/context.h check_a2a): Ulysses splits each tp rank's query
  // and key/value heads over cp.
  if (l.cp > 1 && l.cp_comm == "a2a" &&
      ((m.n_head / l.tp) % l.cp != 0 || (m.n_kv_head / l.tp) % l.cp != 0))
    return refuse("a2a: heads per tp rank not divisible by cp",
                  fmt::format("--cp-comm a2a splits the heads over cp: {} query heads and {} "
                              "key/value heads per tp rank do not divide by cp {}",
                              m.n_head / l.tp, m.n_kv_head / l.tp, l.cp));
  if (j.batch % (int64_t(l.dp) * l.microbatch) != 0)
    return refuse("batch not divisible by dp x microbatch",
                  fmt::format("batch {} is not divisible by dp {} x microbatch {}", j.batch, l.dp,
                              l.microbatch));
  const int64_t mbs = j.batch / (int64_t(l.dp) * l.microbatch);
  if (mbs > kMaxMicrobatches)
    return refuse(
        "more microbatches than the planner replays",
        fmt::format(
            "{} microbatches per step and pipeline: more than the planner replays ({}); give a "
            "--microbatch of at least {} (or check --batch: it counts sequences, not tokens)",
            mbs, kMaxMicrobatches, (mbs * l.microbatch + kMaxMicrobatches - 1) / kMaxMicrobatches));
  if (mbs < l.pp)
    return refuse(
        "fewer microbatches than pipeline stages",
        fmt::format("{} microbatches is fewer than pp {} (a stage would idle)", mbs, l.pp));
  // Blocking exchanges (a GPU cluster without Megatron-Core's overlapped p2p: the replay's
  // rendezvous over the batched lowering) need pp to divide them (pp::build_schedule).
  const bool blocking = j.cluster.compute_units == 0 && !l.pp_overlap;
  if (l.virtual_stages > 1 && mbs % l.pp != 0 && blocking)
    return refuse("interleaved: microbatches not a multiple of pp",
                  fmt::format("interleaved with blocking exchanges: {} microbatches is not a "
                              "multiple of pp {}",
                              mbs, l.pp));
  if (l.virtual_stages > 1 && l.pp < 2)
    return refuse(
        "virtual stages need a pipeline",
        fmt::format(
            "virtual stages {} need pp 2 or more (interleaving splits each pipeline rank's layers "
            "into chunks)",
            l.virtual_stages));
  if (l.virtual_stages > 1 && l.schedule != "interleaved")
    return refuse("virtual stages need the interleaved schedule",
                  fmt::format("virtual stages {} need --schedule interleaved", l.virtual_stages));
  if (l.virtual_stages == 1 && l.schedule == "interleaved")
    return refuse("interleaved schedule needs virtual stages",
                  std::string("--schedule interleaved needs --virtual-stages >= 2"));
  if (l.sp && l.tp == 1)
    return refuse("sp needs tensor parallelism", std::string("sp needs tp > 1"));
  // As train refuses it (trainer.cpp): no software we model runs the two together.
  if (l.schedule == "zb1" && l.pp > 1 && l.recompute == Recompute::kFull)
    return refuse("zb1 with full recomputation (train refuses it)",
                  std::string("zb1 with full recomputation: the W pass needs a block's "
                              "activations after later blocks' recomputation reused them (use "
                              "--recompute selective or none, or another schedule)"));
  if (l.tp_comm_overlap && l.tp > 1 && !l.sp)
    return refuse("--tp-comm-overlap needs sp",
                  std::string("--tp-comm-overlap needs --sp (it overlaps SP's all-gathers and "
                              "reduce-scatters with the GEMMs)"));
  if (l.zero < 0 || l.zero > 3)
    return refuse("no such ZeRO stage", fmt::format("zero stage {} (choose 0..3)", l.zero));
  if (l.zero >= 2 && l.pp > 1)
    return refuse(
        "ZeRO gradient sharding with pipelining is not modelled",
        fmt::format(
            "zero {} with pp {} is not modelled by the planner (train runs it; Megatron-LM and "
            "DeepSpeed pair pipelines with ZeRO 0-1: use 0-1)",
            l.zero, l.pp));
  return std::nullopt;
}

}  // namespace mt::plan
