#include "cli/memory_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "comm/launch.h"
#include "comm/mpi.h"
#include "core/device.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "obs/metrics.h"
#include "parallel/pipeline/partition.h"
#include "plan/planner.h"
#include "plan/sites_memory.h"

namespace mt::cli {

namespace {

// Where the ranks' memory lives and how many ranks share one pool of it.
struct Pool {
  bool gpu = false;
  int64_t free_bytes = -1;  // -1: unknown
  std::string source;       // "MemAvailable in /proc/meminfo", "GPU 0 (cudaMemGetInfo)"
  // Ranks sharing the pool, for a job of `world` ranks: the local backend's are all on this
  // host; under mpirun the processes mpirun put here (a larger layout keeps that count).
  std::function<int(int world)> ranks;
  std::string backend;  // the plan's name for the memory of the backend: local, mpi or ""
};

struct Need {
  double bytes = 0;         // the pool's share of the job: the ranks' estimates added up
  int ranks = 0;            // ranks counted in it
  plan::MemoryBytes worst;  // the largest rank's
  bool lower_bound = false;
  // Llama-family blocks (RMSNorm, SwiGLU, rotary positions, kv heads): the model is not
  // fitted to the runtime's buffers for them (measured 2026-11-27: 8% under the allocator's
  // peak for llama-tiny), so the estimate is "about".
  bool approximate = false;
};

std::string gb(double bytes) { return obs::human_bytes(bytes); }

// The estimate of `o` in `pool`, or nothing where the planner does not model the layout.
std::optional<Need> need_of(const train::TrainOptions& o, const Pool& pool) {
  plan::Job j;
  j.model = plan::from_gpt(o.model);
  j.cluster = plan::cluster_preset("dgx-a100");  // only the backend and node size matter here
  j.cluster.backend = pool.backend;
  j.cluster.gpus_per_node = std::max(j.cluster.gpus_per_node, o.world_size());
  // CPU ranks: the planner's attention memory follows the CPU's kernel choice (blockwise from
  // plan::kOurCpuFlashMinSeq, and with cp; plan::runs_our_flash).
  if (!pool.gpu) j.cluster.compute_units = 1;
  j.gpus = o.world_size();
  j.batch = o.batch;
  j.seq = o.model.seq_len;
  // The runtime keeps f32 master weights, gradients and AdamW state in either precision, and
  // bf16 adds the GEMM weights' copy: the f32 model's states are exact for f32 and a lower
  // bound for bf16. bf16 keeps some activations in bf16 (those only GEMMs read,
  // docs/mixed_precision.md): at least half the f32 model's bytes each, so half its
  // activations bound them from below.
  j.dtype = "f32";
  j.our_runtime = true;
  plan::Layout l;
  l.dp = o.dp;
  l.tp = o.tp;
  l.cp = o.cp;
  l.cp_comm = o.cp_comm;
  l.fused_attention = o.fused_attention();  // --attention naive: the T x T kernel
  l.pp = o.pipeline.pp;
  l.ep = o.ep;
  l.sp = o.sp;
  l.zero = o.zero;
  l.microbatch = o.microbatch_size();
  l.schedule = o.pipeline.pp > 1 ? o.pipeline.schedule : "1f1b";
  l.virtual_stages = o.pipeline.virtual_stages;
  l.recompute = plan::parse_recompute(o.recompute);
  if (!o.pipeline.layers.empty()) l.pp_layers = parallel::pp::parse_layer_counts(o.pipeline.layers);
  l = plan::as_run(j, l);
  if (plan::invalid_reason(j, l)) return std::nullopt;
  // --sites: a site's ranks (ZeRO within the site) with the outer state (plan/sites_memory.h).
  plan::OuterMemory outer;
  outer.sites = o.outer.site_count();
  outer.momentum = o.outer.optimizer == "nesterov";
  outer.compress = o.outer.compress;
  outer.delay = o.outer.delay > 0;
  const std::vector<plan::MemoryBytes> stages =
      o.outer.on() ? plan::memory_by_stage_in_sites(j, l, outer) : plan::memory_by_stage(j, l);
  // A GPU's fused attention keeps no probabilities: only the model states bound it.
  const bool states_only = pool.gpu && o.fused_attention();
  std::vector<double> per_rank;  // every rank of the job: dp x cp x tp ranks per stage
  Need n;
  const bool bf16 = o.dtype != "f32";
  for (plan::MemoryBytes m : stages) {
    if (bf16) m.activations /= 2;  // the lower bound (above), also in what the refusal prints
    const double bytes = states_only ? m.states() : m.total();
    for (int k = 0; k < o.dp * o.cp * o.tp; ++k) per_rank.push_back(bytes);
    if (m.total() > n.worst.total()) n.worst = m;
  }
  // The ranks in the pool: all of them, or (not knowing which) the smallest so many.
  std::sort(per_rank.begin(), per_rank.end());
  n.ranks = std::clamp(pool.ranks(o.world_size()), 1, o.world_size());
  for (int r = 0; r < n.ranks; ++r) n.bytes += per_rank[static_cast<size_t>(r)];
  n.lower_bound = states_only || bf16 || n.ranks < o.world_size();
  const model::GptConfig& c = o.model;
  n.approximate = c.llama_family() || c.kv_heads() != c.n_head ||
                  c.mlp == model::MlpKind::kSwiGlu || c.norm == model::NormKind::kRmsNorm;
  return n;
}

bool fits(const train::TrainOptions& o, const Pool& pool, double* bytes = nullptr) {
  try {
    o.validate();
  } catch (const Error&) {
    return false;  // a change the layout cannot take
  }
  const std::optional<Need> n = need_of(o, pool);
  if (!n) return false;
  if (bytes) *bytes = n->bytes;
  return n->bytes <= static_cast<double>(pool.free_bytes);
}

// One change per kind that makes the run fit, the smallest change first; then, if none does,
// all the memory-saving changes together.
std::vector<std::string> options_that_fit(const train::TrainOptions& o, const Pool& pool) {
  std::vector<std::string> out;
  double bytes = 0;
  auto offer = [&](const train::TrainOptions& c, const std::string& flags) {
    if (!fits(c, pool, &bytes)) return false;
    out.push_back(fmt::format("{} ({})", flags, gb(bytes)));
    return true;
  };
  const int64_t per_replica = o.batch / o.dp, mb = o.microbatch_size();
  // Smaller microbatches (the largest that fits).
  for (int64_t m = mb - 1; m >= 1; --m) {
    if (per_replica % m != 0) continue;
    train::TrainOptions c = o;
    if (o.pipeline.pp > 1) {
      c.microbatch = 0;
      c.pipeline.microbatches = static_cast<int>(per_replica / m);
      if (offer(c, fmt::format("--microbatches {}", per_replica / m))) break;
    } else {
      c.microbatch = m;
      c.pipeline.microbatches = 0;
      if (offer(c, fmt::format("--microbatch {}", m))) break;
    }
  }
  const std::vector<std::string> levels = {"none", "selective", "full"};
  const auto current = std::find(levels.begin(), levels.end(), o.recompute);
  for (auto rc = current == levels.end() ? current : current + 1; rc != levels.end(); ++rc) {
    train::TrainOptions c = o;
    c.recompute = *rc;
    if (offer(c, fmt::format("--recompute {}", *rc))) break;
  }
  for (int z = o.zero + 1; o.dp > 1 && z <= 3; ++z) {
    train::TrainOptions c = o;
    c.zero = z;
    if (offer(c, fmt::format("--zero {}", z))) break;
  }
  for (int t = o.tp * 2; t <= o.model.n_head; t *= 2) {
    train::TrainOptions c = o;
    c.tp = t;
    if (offer(c, fmt::format("--tp {} ({} ranks)", t, c.world_size()))) break;
  }
  for (int p = o.pipeline.pp * 2; p <= o.model.n_layer; p *= 2) {
    train::TrainOptions c = o;
    c.pipeline.pp = p;
    c.pipeline.microbatches = 0;
    c.microbatch = 0;
    c.pipeline.layers.clear();
    if (offer(c, fmt::format("--pp {} ({} ranks)", p, c.world_size()))) break;
  }
  if (out.empty()) {  // everything at once
    train::TrainOptions c = o;
    std::string flags;
    if (o.pipeline.pp > 1) {
      c.microbatch = 0;
      c.pipeline.microbatches = static_cast<int>(per_replica);
      flags = fmt::format("--microbatches {}", per_replica);
    } else {
      c.microbatch = 1;
      c.pipeline.microbatches = 0;
      flags = "--microbatch 1";
    }
    c.recompute = "full";
    flags += " --recompute full";
    if (o.dp > 1) {
      c.zero = 3;
      flags += " --zero 3";
    }
    if (!offer(c, flags)) {
      const std::optional<Need> least = need_of(c, pool);
      out.push_back(fmt::format(
          "none: no change of --microbatch, --recompute, --zero, --tp or --pp alone fits, and "
          "even {}{} (use a shorter --seq, a smaller model or more {})",
          flags, least ? fmt::format(" needs {}", gb(least->bytes)) : std::string(" is not enough"),
          pool.gpu ? "GPUs" : "hosts"));
    }
  }
  return out;
}

Pool host_pool(const train::TrainOptions& o) {
  Pool p;
  comm::LaunchOptions lo;
  lo.backend = comm::parse_backend(o.backend);
  const comm::BackendKind kind = comm::resolve_backend(lo);
  const bool mpirun = kind != comm::BackendKind::kLocal && comm::started_by_mpirun();
  p.backend = kind == comm::BackendKind::kMpi     ? "mpi"
              : kind == comm::BackendKind::kLocal ? "local"
                                                  : "";
  int local_size = 0;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_size = std::atoi(s);
  if (mpirun && local_size > 0)
    p.ranks = [local_size](int) { return local_size; };
  else
    p.ranks = [](int world) { return world; };
  if (o.device == "cuda") {
    p.gpu = true;
    const int gpus = device::cuda_device_count();
    if (gpus < 1) return p;  // run_training says there is none
    auto on_host = p.ranks;
    p.ranks = [on_host, gpus](int world) {  // the fullest GPU's ranks
      return (on_host(world) + gpus - 1) / gpus;
    };
    const int used = std::min(gpus, on_host(o.world_size()));
    for (int g = 0; g < used; ++g) {
      int64_t free_b = 0, total_b = 0;
      if (!device::cuda_memory(g, free_b, total_b)) continue;
      if (p.free_bytes < 0 || free_b < p.free_bytes) {
        p.free_bytes = free_b;
        p.source = fmt::format("GPU {} has {} free of {} (cudaMemGetInfo)", g,
                               gb(static_cast<double>(free_b)), gb(static_cast<double>(total_b)));
      }
    }
    return p;
  }
  const host_memory::Available a = host_memory::available();
  p.free_bytes = a.bytes;
  p.source = a.source;
  return p;
}

std::string breakdown(const plan::MemoryBytes& m) {
  return fmt::format(
      "parameters {}, gradients {}, optimizer state {}, activations {}, communication {}",
      gb(m.parameters), gb(m.gradients), gb(m.optimizer), gb(m.activations), gb(m.communication));
}

}  // namespace

void check_memory_fits(const train::TrainOptions& o) {
  const Pool pool = host_pool(o);
  if (pool.free_bytes < 0) return;
  const std::optional<Need> need = need_of(o, pool);
  if (!need || need->bytes <= static_cast<double>(pool.free_bytes)) return;
  const std::string where = pool.gpu ? "one GPU" : "this host";
  fail(
      "this run needs {}{} of memory on {} ({} rank(s) there; the largest rank {}: {}; the "
      "planner's memory model, docs/planner.md) but {} has {} available ({}). Changes that "
      "would fit, by the same model: {}",
      need->approximate   ? "about "
      : need->lower_bound ? "at least "
                          : "",
      gb(need->bytes), where, need->ranks, gb(need->worst.total()), breakdown(need->worst), where,
      gb(static_cast<double>(pool.free_bytes)), pool.source,
      fmt::join(options_that_fit(o, pool), "; "));
}

}  // namespace mt::cli
