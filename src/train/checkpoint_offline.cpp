// Checkpoints offline (docs/checkpoints.md): the global state of a checkpoint, whether a
// layout can resume it, and its rewrite for another layout (`meshtrain checkpoint reshard`).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "parallel/pipeline/schedule.h"
#include "train/checkpoint.h"
#include "train/checkpoint_format.h"
#include "train/nonfinite.h"
#include "train/outer_optimizer.h"
#include "train/pipeline_stage.h"
#include "train/replica.h"
#include "train/trainer.h"

namespace mt::train::ckpt {

// ---- offline ------------------------------------------------------------------------------

GlobalState load_global(const Index& idx) {
  GlobalState st;
  st.specs = global_specs(idx.config, idx.tp);
  std::vector<Target> targets;
  for (int k = 0; k < kArrays; ++k) st.arrays[k].resize(st.specs.size());
  for (size_t i = 0; i < st.specs.size(); ++i) {
    const int64_t n = shape_numel(st.specs[i].shape);
    Target t;
    t.spec = &st.specs[i];
    t.lo = 0;
    t.hi = n;
    for (int k = 0; k < kArrays; ++k) {
      st.arrays[k][i].assign(static_cast<size_t>(n), 0.f);
      t.dst[k] = st.arrays[k][i].data();
    }
    targets.push_back(t);
  }
  load_targets(idx, targets);
  return st;
}

namespace {

// The first divisors of n (at most 16, found among 1 .. 2^20: not a scan up to a prime n
// of 2^61 that a damaged index may hold).
std::string divisors_text(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= std::min<int64_t>(n, int64_t{1} << 20) && d.size() < 16; ++k)
    if (n % k == 0) d.push_back(k);
  return fmt::format("{}{}", fmt::join(d, ", "), d.back() == n ? "" : ", ...");
}

}  // namespace

void check_resumable(const Index& idx, const TrainOptions& target) {
  if (const std::string why = outer_resume_refusal(idx.dir, idx.step, target); !why.empty())
    fail("{}", why);
  TrainOptions o = target;
  o.model = idx.config;
  if (idx.batch > 0) {
    o.batch = idx.batch;
    if (o.dp >= 1 && idx.batch % o.dp != 0)
      fail(
          "--dp {} does not divide the batch {} that checkpoint '{}' was trained with (a resume "
          "keeps --batch {}, and every dp rank takes batch / dp samples): choose a --dp among {}",
          o.dp, idx.batch, idx.dir, idx.batch, divisors_text(idx.batch));
    // The microbatch count is the resumed run's choice, not the checkpoint's: without
    // --microbatches, check with the smallest count a pipeline of this batch can run.
    const PipelineOptions& po = o.pipeline;
    if (po.pp > 1 && po.microbatches == 0 && o.microbatch == 0) {
      const int64_t per_replica = idx.batch / std::max(o.dp, 1);
      const bool interleaved = po.schedule == "interleaved";
      // Among pp .. pp + 2^20 (and an int): not a scan up to a prime batch of 2^61.
      const int64_t last = std::min<int64_t>(
          {per_replica, int64_t{po.pp} + (int64_t{1} << 20), std::numeric_limits<int>::max()});
      for (int64_t m = po.pp; m <= last; ++m)
        if (per_replica % m == 0 && (!interleaved || m % po.pp == 0)) {
          o.pipeline.microbatches = static_cast<int>(m);
          break;
        }
    }
  } else {  // an index without its batch: check the layout alone, with a batch it divides
    o.batch = std::max(o.dp, 1) * std::max(o.microbatch_count(), 1);
    o.microbatch = 0;
  }
  if (o.data.empty()) o.data = idx.dir;  // validate() wants data; a resume names its own
  try {
    o.validate();
  } catch (const Error& e) {
    fail(
        "checkpoint '{}' (trained with --batch {}) could not be resumed as dp {}{} tp {} pp {} "
        "zero {}: {}",
        idx.dir, idx.batch, o.dp, o.cp > 1 ? fmt::format(" cp {}", o.cp) : "", o.tp, o.pipeline.pp,
        o.zero, e.what());
  }
}

int write_resharded(const Index& idx, const GlobalState& st, const TrainOptions& o,
                    const std::string& out_dir) {
  // D: the replica's gradient group, dp x cp (the cp ranks of a replica share its ZeRO
  // shards); d is a rank of that group, as the "dp" of a saved shard's coords.
  const int P = o.pipeline.pp, D = o.dp * o.cp, T = o.tp;
  check_resumable(idx, o);
  std::unique_ptr<parallel::pp::Schedule> sched;
  std::unique_ptr<parallel::pp::Partition> part;
  if (P > 1) {
    const PipelineOptions& po = o.pipeline;
    sched = std::make_unique<parallel::pp::Schedule>(
        parallel::pp::build_schedule(parallel::pp::parse_schedule_kind(po.schedule), P,
                                     o.microbatch_count(), po.virtual_stages));
    part = std::make_unique<parallel::pp::Partition>(make_partition(o, sched->num_chunks()));
  }
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < st.specs.size(); ++i) by_name[st.specs[i].name] = i;
  // Nothing non-finite is written (train/nonfinite.h): a damaged source is refused first.
  for (size_t i = 0; i < st.specs.size(); ++i)
    for (int k = 0; k < kArrays; ++k) {
      const std::string bad =
          describe_nonfinite(fmt::format("{} of '{}'", kArrayNames[k], st.specs[i].name),
                             st.arrays[k][i].data(), static_cast<int64_t>(st.arrays[k][i].size()));
      if (!bad.empty())
        fail("checkpoint '{}' is damaged: {}; it is not resharded (nothing was written)", idx.dir,
             bad);
    }
  const fs::path dir = out_dir;
  fs::create_directories(dir);
  const std::string name = step_name(idx.step);
  const fs::path tmp = dir / (name + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    model::GptConfig c = idx.config;
    if (T > 1) c.vocab_pad_multiple = model::tp_vocab_pad(T);
    std::vector<FileInfo> files;
    std::vector<Piece> all_pieces;
    for (int p = 0; p < P; ++p)
      for (int d = 0; d < D; ++d)
        for (int t = 0; t < T; ++t) {
          const model::StageParts parts =
              P > 1 ? stage_parts(*sched, *part, p) : model::StageParts{};
          std::vector<model::ParamSpec> specs = model::stage_param_specs(c, parts);
          if (T > 1) specs = model::tp_shard_specs(std::move(specs), t, T);
          int64_t numel = 0;
          for (const auto& s : specs) numel += shape_numel(s.shape);
          const int64_t padded = (numel + D - 1) / D * D;
          int64_t lo = 0, hi = numel;
          if (o.zero == 0 && d != 0) continue;
          if (o.zero > 0) {
            lo = d * (padded / D);
            hi = lo + padded / D;
          }
          std::vector<PieceData> pieces;
          std::vector<std::vector<float>> bufs;
          bufs.reserve(specs.size() * kArrays);
          int64_t off = 0;
          for (const model::ParamSpec& s : specs) {
            const int64_t n = shape_numel(s.shape);
            const int64_t a = std::max(lo, off), b = std::min(hi, off + n);
            const bool copy_elsewhere =
                (T > 1 && t != 0 && s.tp_split == model::TpSplit::kReplicated) ||
                (P > 1 && p == P - 1 && c.tied && s.name == "transformer.wte.weight");
            if (a < b && !copy_elsewhere) {
              const size_t gi = by_name.at(s.name);
              const int64_t cols = s.full_shape().size() > 1 ? s.full_shape()[1] : 1;
              const int64_t limit =
                  s.real_rows >= 0 ? s.real_rows * cols : shape_numel(s.full_shape());
              PieceData pd;
              pd.meta.tensor = s.name;
              pd.meta.tp_rank = s.tp_rank;
              pd.meta.tp_size = s.tp_size;
              pd.meta.local_lo = a - off;
              pd.meta.local_hi = b - off;
              for (int k = 0; k < kArrays; ++k) {
                bufs.emplace_back(static_cast<size_t>(b - a), 0.f);
                float* dst = bufs.back().data();
                const std::vector<float>& src = st.arrays[k][gi];
                model::for_each_tp_run(s, [&](int64_t lf, int64_t gf, int64_t len) {
                  const int64_t x = std::max(lf, a - off), y = std::min(lf + len, b - off);
                  for (int64_t e = x; e < y; ++e) {
                    const int64_t ge = gf + (e - lf);
                    dst[e - (a - off)] = ge < limit ? src[static_cast<size_t>(ge)] : 0.f;
                  }
                });
                pd.src[k] = dst;
              }
              pieces.push_back(std::move(pd));
            }
            off += n;
          }
          if (pieces.empty()) continue;
          const int rank = (p * D + d) * T + t;
          const std::string file = fmt::format("rank-{:05}.safetensors", rank);
          const int64_t bytes =
              write_shard(tmp / file, pieces,
                          {{"format", "meshtrain-checkpoint-shard"},
                           {"step", std::to_string(idx.step)},
                           {"rank", std::to_string(rank)},
                           {"coords", fmt::format("pp {} dp {} tp {}", p, d, t)}});
          const int fi = static_cast<int>(files.size());
          files.push_back({file, bytes, rank});
          for (PieceData& pd : pieces) {
            pd.meta.file = fi;
            all_pieces.push_back(pd.meta);
          }
        }
    const json src = json::parse(idx.json_text);
    const json index =
        make_index(idx.step, src.at("trainer"), idx.config, layout_json(o), T, files, all_pieces);
    write_small_atomic(tmp / "index.json", index.dump(1));
    publish(dir, tmp, name, 0, idx.step, -1, /*forward_only=*/true);
    return static_cast<int>(files.size());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed write (a full disk) leaves nothing behind
    throw;
  }
}

}  // namespace mt::train::ckpt
