#include "train/run_records.h"

#include <fmt/format.h>

#include <thread>

#include "model/gpt.h"
#include "obs/metrics.h"
#include "obs/run_info.h"

namespace mt::train {

// int64 values travel as the bits of two f32 elements through an all-gather, which copies
// and never does arithmetic on them.
std::vector<int64_t> gather_int64(comm::Group* g, const std::vector<int64_t>& mine) {
  if (!g) return mine;
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(g->size()));
  const int64_t n = 2 * static_cast<int64_t>(mine.size());
  g->all_gather(comm::Buf(reinterpret_cast<float*>(const_cast<int64_t*>(mine.data())), n),
                comm::Buf(reinterpret_cast<float*>(all.data()), n * g->size()));
  return all;
}

// The first metrics row's "run": what `meshtrain report` puts in its header.
nlohmann::json run_header(const TrainOptions& o, int threads, comm::Group& world,
                          const model::GptConfig& padded) {
  const model::GptConfig& m = o.model;
  return {{"command", obs::command_line()},
          {"commit", obs::git_commit()},
          {"started", obs::utc_now()},
          {"machine",
           {{"host", obs::host_name()},
            {"cpu", obs::cpu_model()},
            {"cores", std::thread::hardware_concurrency()},
            {"threads_per_rank", threads},
            {"device", o.device},
            {"backend", world.backend_kind()}}},
          {"model",
           {{"name", m.name},
            {"n_layer", m.n_layer},
            {"n_head", m.n_head},
            {"n_kv_head", m.kv_heads()},
            {"d_model", m.d_model},
            {"d_ff", m.d_ff},
            {"vocab", m.vocab},
            {"padded_vocab", padded.padded_vocab()},
            {"seq", m.seq_len},
            {"params", model::count_params(model::gpt_param_specs(m))}}},
          {"layout",
           {{"world", world.size()},
            {"dp", o.dp},
            {"tp", o.tp},
            {"pp", o.pipeline.pp},
            {"sp", o.sp},
            {"cp", o.cp},
            {"ep", o.ep},
            {"zero", o.zero},
            {"schedule", o.pipeline.pp > 1 ? o.pipeline.schedule : ""},
            {"virtual_stages", o.pipeline.virtual_stages},
            {"microbatches", o.microbatches_per_step()},
            {"microbatch", o.microbatch_size()},
            {"recompute", o.recompute},
            {"dtype", o.dtype}}},
          {"batch", o.batch},
          {"tokens_per_step", o.batch * m.seq_len},
          {"steps", o.steps},
          {"data", o.data}};
}

RankPeaks gather_rank_peaks(comm::Group* scalars, const mem::Snapshot& snap) {
  std::vector<int64_t> mine(snap.peak_bytes.begin(), snap.peak_bytes.end());
  mine.push_back(snap.total_peak_bytes);
  RankPeaks p;
  p.all = gather_int64(scalars, mine);
  p.width = mine.size();
  for (size_t r = 0; r < p.all.size() / p.width; ++r)
    if (p.total(r) > p.total(p.worst)) p.worst = r;
  return p;
}

nlohmann::json memory_by_rank(comm::Group* scalars, const mem::Tracker& tracker) {
  const RankPeaks p = gather_rank_peaks(scalars, tracker.snapshot());
  nlohmann::json out = {{"categories", nlohmann::json::array()},
                        {"peak_bytes", nlohmann::json::array()},
                        {"total_peak_bytes", nlohmann::json::array()}};
  for (int c = 0; c < mem::kNumCategories; ++c)
    out["categories"].push_back(mem::category_name(static_cast<mem::Category>(c)));
  for (size_t r = 0; r < p.all.size() / p.width; ++r) {
    out["peak_bytes"].push_back(std::vector<int64_t>(
        p.all.begin() + static_cast<std::ptrdiff_t>(r * p.width),
        p.all.begin() + static_cast<std::ptrdiff_t>(r * p.width + p.width - 1)));
    out["total_peak_bytes"].push_back(p.total(r));
  }
  out["worst_rank"] = p.worst;
  return out;
}

std::string peak_memory_line(const RankPeaks& p, const comm::MeshShape& shape, bool ep, bool cp) {
  std::string cats;
  for (int c = 0; c < mem::kNumCategories; ++c)
    cats += fmt::format("{}{} {}", c ? ", " : "", mem::category_name(static_cast<mem::Category>(c)),
                        obs::human_bytes(static_cast<double>(p.at(p.worst, size_t(c)))));
  const auto at = shape.coords(static_cast<int>(p.worst));
  return fmt::format("peak memory: worst rank {} (pp {} dp {}{}{} tp {}) {}: {}", p.worst,
                     at.at("pp"), at.at("dp"), ep ? fmt::format(" ep {}", at.at("ep")) : "",
                     cp ? fmt::format(" cp {}", at.at("cp")) : "", at.at("tp"),
                     obs::human_bytes(static_cast<double>(p.total(p.worst))), cats);
}

std::string bytes_across_hosts_line(const std::vector<std::pair<std::string, comm::Group*>>& dims,
                                    const comm::MeshShape& shape, const comm::HostMap& hosts,
                                    comm::Group& scalars) {
  std::vector<float> kib;
  for (const auto& [dim, g] : dims)
    kib.push_back(comm::spans_hosts(*g, hosts)
                      ? static_cast<float>(g->recorder().bytes_of_group(g->name()).recv_bytes) /
                            1024.0f
                      : 0.0f);
  scalars.all_reduce(comm::Buf(kib.data(), static_cast<int64_t>(kib.size())));
  std::string line = "bytes received over groups that cross hosts (all ranks):";
  for (size_t i = 0; i < dims.size(); ++i)
    if (shape.size(dims[i].first) > 1)
      line += fmt::format(" {} {}", dims[i].first,
                          obs::human_bytes(static_cast<double>(kib[i]) * 1024.0));
  return line;
}

}  // namespace mt::train
