// `meshtrain inspect CKPT`, `meshtrain reshard CKPT --out DIR --dp D --tp T --pp P --zero Z`,
// `meshtrain export CKPT --out FILE.safetensors` (docs/checkpoints.md). CKPT is a checkpoint
// directory (step-N) or a directory holding them (its newest is taken).
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "core/clock.h"
#include "core/error.h"
#include "model/gpt.h"
#include "train/hf_export.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {

namespace fs = std::filesystem;
namespace ckpt = train::ckpt;

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / "index.json")) return path;
  const std::vector<std::string> all = ckpt::list_checkpoints(path);
  if (all.empty())
    fail("'{}' is neither a checkpoint (no index.json) nor a directory holding one (step-N)", path);
  return all.front();
}

// The checkpoint's model with its saved master weights (tp = 1, the whole model).
std::unique_ptr<model::Gpt> model_of(const ckpt::Index& idx) {
  auto gpt = std::make_unique<model::Gpt>(idx.config, idx.seed);
  std::vector<ckpt::Target> targets;
  for (model::Param& p : gpt->params().params()) {
    ckpt::Target t;
    t.spec = &p.spec;
    t.hi = p.value.numel();
    t.dst[0] = p.value.f32();
    targets.push_back(t);
  }
  ckpt::load_targets(idx, targets);
  return gpt;
}

// Whether `inner` is `outer` or lies inside it (both made absolute, symbolic links resolved
// as far as they exist).
bool same_or_inside(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(fs::absolute(inner), ec);
  const fs::path b = fs::weakly_canonical(fs::absolute(outer), ec);
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
    if (bi->empty()) continue;  // a trailing separator
    if (ai == a.end() || *ai != *bi) return false;
  }
  return true;
}

// reshard never writes into its source: not into the path named (a checkpoint or the
// directory holding it), nor into the checkpoint's own directory, where its step-N would be
// replaced. A non-empty --out only with --force.
void check_reshard_out(const std::string& named, const std::string& ckpt_dir,
                       const std::string& out, bool force) {
  const fs::path holder = fs::path(ckpt_dir).parent_path();
  for (const fs::path& src : {fs::path(named), fs::path(ckpt_dir)})
    if (same_or_inside(out, src))
      fail(
          "reshard --out '{}' is {}the source '{}': the resharded checkpoint would overwrite "
          "or mix with it (name a new folder outside it)",
          out, same_or_inside(src, out) ? "" : "inside ", src.string());
  if (same_or_inside(out, holder) && same_or_inside(holder, out))
    fail(
        "reshard --out '{}' holds the source checkpoint '{}': its {} would be replaced by the "
        "resharded one (name a new folder)",
        out, ckpt_dir, fs::path(ckpt_dir).filename().string());
  std::error_code ec;
  if (force || !fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec))
    fail("reshard --out '{}' exists and is not a folder (name a new folder)", out);
  fs::directory_iterator it(out, ec);
  if (it != fs::directory_iterator())
    fail(
        "reshard --out '{}' is not empty (it holds '{}'): name a new or empty folder, or add "
        "--force to write beside what it holds (a checkpoint of the same step there is "
        "replaced; 'latest' never moves back to an older step)",
        out, it->path().filename().string());
}

}  // namespace

void register_checkpoint(CLI::App& app) {
  {
    auto path = std::make_shared<std::string>();
    auto no_verify = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("inspect", "what a checkpoint holds; checks its checksums");
    cmd->add_option("checkpoint", *path, "checkpoint directory (or a --checkpoint-dir)")
        ->required();
    cmd->add_flag("--no-verify", *no_verify, "skip reading the data to check the checksums");
    cmd->callback([path, no_verify] {
      const ckpt::Index idx = ckpt::read_index(resolve(*path));
      fmt::print("checkpoint {}\n", idx.dir);
      fmt::print("step {} (AdamW step {}), seed {}\n", idx.step, idx.adam_steps, idx.seed);
      fmt::print("model {}: n_layer {} n_head {} d_model {} d_ff {} vocab {} seq_len {}\n",
                 idx.config.name, idx.config.n_layer, idx.config.n_head, idx.config.d_model,
                 idx.config.d_ff, idx.config.vocab, idx.config.seq_len);
      fmt::print("layout {}; {} files, {:.1f} MB\n", idx.layout_text, idx.files.size(),
                 idx.data_bytes() / 1e6);
      std::map<std::string, std::pair<int, int64_t>> per;  // pieces, elements
      for (const ckpt::Piece& p : idx.pieces) {
        per[p.tensor].first += 1;
        per[p.tensor].second += p.elems();
      }
      fmt::print("{:<36} {:>14} {:>7} {:>12} {:>10}\n", "tensor", "global shape", "pieces",
                 "elements", "MB (x3)");
      for (const auto& [name, ti] : idx.tensors)
        fmt::print("{:<36} {:>14} {:>7} {:>12} {:>10.2f}\n", name,
                   fmt::format("{}", fmt::join(ti.shape, "x")), per[name].first, per[name].second,
                   per[name].second * 12 / 1e6);
      for (const ckpt::FileInfo& f : idx.files)
        fmt::print("file {} (rank {}): {} bytes\n", f.name, f.rank, f.bytes);
      if (*no_verify) return;
      const double t0 = now_s();
      const std::vector<std::string> problems = ckpt::verify(idx);
      for (const std::string& p : problems) fmt::print("DAMAGED {}\n", p);
      if (!problems.empty())
        fail("checkpoint '{}': {} damaged piece(s) of {} (see above)", idx.dir, problems.size(),
             idx.pieces.size());
      fmt::print("checksums OK: {} pieces x 3 arrays (CRC32C), read in {:.2f} s\n",
                 idx.pieces.size(), now_s() - t0);
    });
  }
  {
    struct Flags {
      std::string path, out;
      std::optional<int> dp, cp, tp, pp, zero;  // not given: the checkpoint's
      int virtual_stages = 1, microbatches = 0;
      std::string schedule = "1f1b", pp_layers;
      bool force = false;
    };
    auto f = std::make_shared<Flags>();
    CLI::App* cmd =
        app.add_subcommand("reshard", "rewrite a checkpoint for another layout (offline)");
    cmd->add_option("checkpoint", f->path, "checkpoint directory (or a --checkpoint-dir)")
        ->required();
    cmd->add_option("--out", f->out, "directory to write step-N into")->required();
    cmd->add_option("--dp", f->dp, "data-parallel ranks (default: the checkpoint's)");
    cmd->add_option("--cp", f->cp,
                    "context-parallel ranks (default: the checkpoint's; the ZeRO shards are "
                    "over dp x cp)");
    cmd->add_option("--tp", f->tp, "tensor-parallel ranks (default: the checkpoint's)");
    cmd->add_option("--pp", f->pp, "pipeline stages (default: the checkpoint's)");
    cmd->add_option("--zero", f->zero, "ZeRO stage 0-3 (default: the checkpoint's)");
    cmd->add_option("--schedule", f->schedule, "pipeline schedule (the layer split follows it)");
    cmd->add_option("--virtual-stages", f->virtual_stages, "chunks per pipeline rank");
    cmd->add_option("--microbatches", f->microbatches, "pipeline microbatches");
    cmd->add_option("--pp-layers", f->pp_layers, "layers per chunk, comma-separated");
    cmd->add_flag("--force", f->force,
                  "write into a non-empty --out (a checkpoint of the same step there is "
                  "replaced; 'latest' never moves back)");
    cmd->callback([f] {
      const std::string source = resolve(f->path);
      check_reshard_out(f->path, source, f->out, f->force);  // before anything is read
      const ckpt::Index idx = ckpt::read_index(source);
      train::TrainOptions o;
      o.model = idx.config;
      // A dimension not named keeps the checkpoint's: nothing changes unasked.
      o.dp = f->dp.value_or(idx.dp);
      o.cp = f->cp.value_or(idx.cp);
      o.tp = f->tp.value_or(idx.tp);
      o.zero = f->zero.value_or(idx.zero);
      o.pipeline.pp = f->pp.value_or(idx.pp);
      o.pipeline.schedule = f->schedule;
      o.pipeline.virtual_stages = f->virtual_stages;
      o.pipeline.microbatches = f->microbatches;
      o.pipeline.layers = f->pp_layers;
      if (o.dp < 1 || o.cp < 1 || o.tp < 1 || o.pipeline.pp < 1)
        fail("--dp {} --cp {} --tp {} --pp {}: each must be at least 1", o.dp, o.cp, o.tp,
             o.pipeline.pp);
      ckpt::check_resumable(idx, o);  // before the slow part: reading the whole checkpoint
      const double t0 = now_s();
      const ckpt::GlobalState st = ckpt::load_global(idx);
      const int files = ckpt::write_resharded(idx, st, o, f->out);
      std::fprintf(stderr,
                   "resharded %s (%s) into %s/step-%08lld as dp %d%s tp %d pp %d zero %d: "
                   "%d files in %.2f s\n",
                   idx.dir.c_str(), idx.layout_text.c_str(), f->out.c_str(),
                   static_cast<long long>(idx.step), o.dp,
                   o.cp > 1 ? fmt::format(" cp {}", o.cp).c_str() : "", o.tp, o.pipeline.pp, o.zero,
                   files, now_s() - t0);
    });
  }
  {
    auto path = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "export", "a checkpoint's weights (any layout) as one safetensors file, HF GPT-2 names");
    cmd->add_option("checkpoint", *path, "checkpoint directory (or a --checkpoint-dir)")
        ->required();
    cmd->add_option("--out", *out, "safetensors file to write")->required();
    cmd->callback([path, out] {
      const ckpt::Index idx = ckpt::read_index(resolve(*path));
      train::export_hf_safetensors(*model_of(idx), *out);
      std::fprintf(stderr, "exported step %lld of %s to %s\n", static_cast<long long>(idx.step),
                   idx.dir.c_str(), out->c_str());
    });
  }
}

}  // namespace mt::cli
