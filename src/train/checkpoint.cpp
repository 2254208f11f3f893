// The training loop's side of checkpoints (docs/checkpoints.md): every rank saves its
// optimizer range, resumes into any layout, and the injected faults of the fault tests.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/group.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"
#include "core/json.h"
#include "parallel/pipeline/schedule.h"
#include "train/checkpoint_format.h"
#include "train/nonfinite.h"
#include "train/outer_optimizer.h"
#include "train/pipeline_stage.h"
#include "train/replica.h"
#include "train/resume_changes.h"
#include "train/trainer.h"

namespace mt::train::ckpt {

namespace {

// Strings travel as the bits of f32 elements through an all-gather (copies only).
std::vector<std::string> gather_strings(comm::Group& g, const std::string& mine) {
  const int64_t words = (static_cast<int64_t>(mine.size()) + 3) / 4;
  std::vector<float> lens_in(2), lens_out(2 * static_cast<size_t>(g.size()));
  const int64_t bytes = static_cast<int64_t>(mine.size());
  std::memcpy(lens_in.data(), &bytes, 8);
  g.all_gather(comm::Buf(lens_in.data(), 2), comm::Buf(lens_out.data(), 2 * g.size()));
  std::vector<int64_t> lens(static_cast<size_t>(g.size())), counts(lens.size());
  int64_t total = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    std::memcpy(&lens[r], &lens_out[2 * r], 8);
    counts[r] = (lens[r] + 3) / 4;
    total += counts[r];
  }
  std::vector<float> in(static_cast<size_t>(std::max<int64_t>(words, 1))),
      out(static_cast<size_t>(std::max<int64_t>(total, 1)));
  std::memcpy(in.data(), mine.data(), mine.size());
  g.all_gather(comm::Buf(in.data(), words), comm::Buf(out.data(), total), counts);
  std::vector<std::string> all;
  int64_t at = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    all.emplace_back(reinterpret_cast<const char*>(out.data() + at), static_cast<size_t>(lens[r]));
    at += counts[r];
  }
  return all;
}

// Every rank learns whether any rank has an error (`mine` not empty); returns the lowest such
// rank's, prefixed "rank R: " when the group has several ranks ("" when none has one).
std::string first_rank_error(comm::Group& g, const std::string& mine) {
  float flags[2] = {mine.empty() ? 0.f : 1.f,
                    mine.empty() ? 0.f : static_cast<float>(g.size() - g.rank())};
  g.all_reduce(comm::Buf(flags, 2), comm::ReduceOp::kMax);
  if (flags[0] == 0) return "";
  const int first = static_cast<int>(g.size() - flags[1]);
  const std::vector<std::string> all = gather_strings(g, mine);
  const std::string& e = all[static_cast<size_t>(first)];
  return g.size() > 1 ? fmt::format("rank {}: {}", first, e) : e;
}

// The rank's optimizer range [opt_lo, opt_hi) of master values, Adam m and v, as host
// pointers: on the CPU the tensors themselves; on a GPU a host copy (filled from the GPU
// before a save by pull(), written back after a load by push()).
struct OptimizerArrays {
  explicit OptimizerArrays(Replica& rep)
      : dev{rep.opt_values(), rep.opt->m().f32(), rep.opt->v().f32()},
        n(rep.opt_hi - rep.opt_lo),
        on_gpu(device::on_cuda()) {
    for (int k = 0; k < kArrays; ++k) {
      if (on_gpu) host[k].resize(static_cast<size_t>(n));
      ptr[k] = on_gpu ? host[k].data() : dev[k];
    }
  }
  void pull() {
    if (on_gpu)
      for (int k = 0; k < kArrays; ++k)
        device::copy(host[k].data(), mem::Device::kCpu, dev[k], mem::Device::kCuda, n * 4);
  }
  void push() {
    if (on_gpu)
      for (int k = 0; k < kArrays; ++k)
        device::copy(dev[k], mem::Device::kCuda, host[k].data(), mem::Device::kCpu, n * 4);
  }
  float* dev[kArrays];
  float* ptr[kArrays];
  std::vector<float> host[kArrays];
  int64_t n;
  bool on_gpu;
};

// What a replica saves: its optimizer range (ZeRO 0: on dp rank 0 only), per parameter,
// leaving out the copies another rank saves (tp-replicated tensors on tp ranks > 0, the
// last pipeline stage's tied wte).
std::vector<PieceData> replica_pieces(Replica& rep, const OptimizerArrays& arrays) {
  std::vector<PieceData> out;
  if (rep.zero == 0 && rep.dp.rank() != 0) return out;
  const int64_t lo = rep.opt_lo, hi = rep.opt_hi;
  float* const* src = arrays.ptr;
  rep.gpt.params().for_each_in_range(lo, hi, [&](const model::Param& p, int64_t a, int64_t b) {
    const std::pair<int64_t, int64_t> range{p.offset_elems,
                                            p.offset_elems + shape_numel(p.spec.shape)};
    if (std::binary_search(rep.uncounted.begin(), rep.uncounted.end(), range)) return;
    PieceData d;
    d.meta.tensor = p.spec.name;
    d.meta.tp_rank = p.spec.tp_rank;
    d.meta.tp_size = p.spec.tp_size;
    d.meta.ep_rank = p.spec.ep_rank;
    d.meta.ep_size = p.spec.ep_size;
    d.meta.local_lo = a - p.offset_elems;
    d.meta.local_hi = b - p.offset_elems;
    for (int k = 0; k < kArrays; ++k) d.src[k] = src[k] + (a - lo);
    out.push_back(std::move(d));
  });
  return out;
}

std::vector<Target> replica_targets(Replica& rep, const OptimizerArrays& arrays) {
  std::vector<Target> out;
  const int64_t lo = rep.opt_lo, hi = rep.opt_hi;
  float* const* dst = arrays.ptr;
  rep.gpt.params().for_each_in_range(lo, hi, [&](const model::Param& p, int64_t a, int64_t b) {
    Target t;
    t.spec = &p.spec;
    t.lo = a - p.offset_elems;
    t.hi = b - p.offset_elems;
    for (int k = 0; k < kArrays; ++k) t.dst[k] = dst[k] + (a - lo);
    out.push_back(t);
  });
  return out;
}

}  // namespace

json layout_json(const TrainOptions& o) {
  return {{"dp", o.dp},
          {"cp", o.cp},
          {"cp_comm", o.cp_comm},
          {"ep", o.ep},
          {"tp", o.tp},
          {"pp", o.pipeline.pp},
          {"zero", o.zero},
          {"sp", o.sp},
          {"mesh_order", o.mesh_order},
          {"schedule", o.pipeline.schedule},
          {"virtual_stages", o.pipeline.virtual_stages},
          {"microbatches", o.pipeline.microbatches},
          {"dtype", o.dtype}};
}

// ---- the training loop's side -----------------------------------------------------------

void save(const TrainOptions& o, const RankGroups& g, Replica& rep, int64_t step, bool talk,
          int64_t nonfinite_in_row) {
  const double t0 = now_s();
  const fs::path dir = o.checkpoint_dir;
  const std::string name = step_name(step);
  const fs::path tmp = dir / (name + ".tmp");
  const int rank = g.world.rank();
  const bool lead = rank == 0;
  OptimizerArrays arrays(rep);
  arrays.pull();
  std::vector<PieceData> pieces;
  if (!g.extension || g.extension->saves_model()) pieces = replica_pieces(rep, arrays);
  // Nothing non-finite is written: every rank checks what it would write, and all refuse
  // alike (the lowest such rank's finding), before anything is made on disk.
  std::string bad;
  for (const PieceData& p : pieces) {
    for (int k = 0; k < kArrays && bad.empty(); ++k)
      bad = describe_nonfinite(fmt::format("{} of '{}'", kArrayNames[k], p.meta.tensor), p.src[k],
                               p.meta.elems());
    if (!bad.empty()) break;
  }
  const std::string refusal = first_rank_error(g.world, bad);
  if (!refusal.empty())
    fail_run(
        "the checkpoint of step {} is not written: {}; {} keeps what it holds (the run's "
        "weights are damaged: lower --lr, or check the data)",
        step, refusal, dir.string());
  if (lead) {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  g.world.barrier();
  json mine = json::object();
  // A write that fails (a full disk) leaves no temporary file: this rank removes its shard,
  // rank 0 the temporary directory (if another rank failed, its next collective fails too).
  const std::string shard_file = fmt::format("rank-{:05}.safetensors", rank);
  auto clean_up = [&] {
    std::error_code ec;
    fs::remove(tmp / shard_file, ec);
    if (lead) fs::remove_all(tmp, ec);
  };
  int64_t total_bytes = 0;
  try {
    if (!pieces.empty()) {
      const std::string& file = shard_file;
      const int64_t bytes = write_shard(
          tmp / file, pieces,
          {{"format", "meshtrain-checkpoint-shard"},
           {"step", std::to_string(step)},
           {"rank", std::to_string(rank)},
           {"coords", fmt::format("pp {} dp {} tp {}", g.pp.rank(), g.dp.rank(), g.tp.rank())}});
      json pj = json::array();
      for (const PieceData& p : pieces) pj.push_back(piece_json(p.meta));
      mine = {{"name", file}, {"bytes", bytes}, {"rank", rank}, {"pieces", pj}};
    }
    if (g.extension) g.extension->save(tmp.string(), step);
    maybe_fault("save-shards", step, rank);
    const std::vector<std::string> all = gather_strings(g.world, mine.dump());
    if (lead) {
      std::vector<FileInfo> files;
      std::vector<Piece> all_pieces;
      for (const std::string& s : all) {
        const json j = json::parse(s);
        if (j.empty()) continue;
        const int fi = static_cast<int>(files.size());
        files.push_back({j.at("name"), j.at("bytes"), j.at("rank")});
        total_bytes += files.back().bytes;
        for (const json& p : j.at("pieces")) {
          Piece pc;
          pc.tensor = p.at("tensor");
          pc.file = fi;
          pc.tp_rank = p.at("tp").at(0);
          pc.tp_size = p.at("tp").at(1);
          if (p.contains("ep")) {
            pc.ep_rank = p.at("ep").at(0);
            pc.ep_size = p.at("ep").at(1);
          }
          pc.local_lo = p.at("local").at(0);
          pc.local_hi = p.at("local").at(1);
          for (int k = 0; k < kArrays; ++k) {
            pc.offset_bytes[k] = p.at("offsets").at(k);
            pc.crc[k] = p.at("crc32c").at(k);
          }
          all_pieces.push_back(std::move(pc));
        }
      }
      const int64_t warmup = o.warmup >= 0 ? o.warmup : o.steps / 20;
      const json trainer = {
          {"step", step},
          {"adam_steps", rep.opt->steps_taken()},
          {"seed", o.seed},
          {"samples_done", step * o.batch},
          {"batch", o.batch},
          {"seq_len", o.model.seq_len},
          {"data", o.data},
          {"data_format", o.data_format},
          // The sample order (train/sample_order.h): with the seed and the step, where the
          // data continues; a resume that changes it says so (resume_changes).
          {"shuffle", o.shuffle},
          {"lr", o.lr},
          {"min_lr_ratio", o.min_lr_ratio},
          {"warmup", warmup},
          {"steps", o.steps},
          {"next_lr", lr_at(step, warmup, o.steps, o.lr, o.min_lr_ratio)},
          {"grad_clip", o.grad_clip},
          {"adamw",
           {{"beta1", o.adamw.beta1},
            {"beta2", o.adamw.beta2},
            {"eps", o.adamw.eps},
            {"weight_decay", o.adamw.weight_decay}}},
          {"nonfinite_in_row", nonfinite_in_row},
          {"rng",
           "none at run time: initialisation is Philox4x32-10 keyed by the seed, no dropout"}};
      json state = trainer;
      // --moe-balance bias: the selection biases are training state (identical on every rank).
      if (o.moe.balance_bias) state["moe_bias"] = rep.gpt.moe_bias();
      const json index = make_index(step, state, o.model, layout_json(o), o.tp, files, all_pieces);
      write_small_atomic(tmp / "index.json", index.dump(1));
      publish(dir, tmp, name, o.keep_checkpoints, step, rank);
    }
  } catch (...) {
    clean_up();
    throw;
  }
  g.world.barrier();
  if (talk) {
    const double dt = now_s() - t0;
    std::fprintf(stderr, "saved checkpoint %s (%.1f MB in %.2f s, %.2f GB/s)\n",
                 (dir / name).c_str(), total_bytes / 1e6, dt, total_bytes / 1e9 / dt);
  }
}

namespace {
// --moe-balance bias: the biases a checkpoint saved (none when it was saved without: they
// start at 0, and resume_changes says so).
void restore_moe_bias(const json& trainer, std::vector<float>& bias, const std::string& dir) {
  if (!trainer.contains("moe_bias")) {
    std::fill(bias.begin(), bias.end(), 0.f);
    return;
  }
  const json& b = trainer.at("moe_bias");
  if (!b.is_array() || b.size() != bias.size())
    fail(
        "checkpoint '{}': trainer.moe_bias holds {} values, the model's MoE layers {} (saved "
        "from another model?)",
        dir, b.is_array() ? b.size() : 0, bias.size());
  for (size_t i = 0; i < bias.size(); ++i) {
    if (!b[i].is_number() || !std::isfinite(b[i].get<double>()))
      fail("checkpoint '{}': trainer.moe_bias[{}] is not a finite number", dir, i);
    bias[i] = b[i].get<float>();
  }
}

// After every rank wrote its optimizer range (and pushed it to its GPU): the other ZeRO-1/2
// ranks' values (a collective of the dp group), the bf16 copy.
void gather_loaded_values(Replica& rep) {
  if (rep.zero == 1 || rep.zero == 2) {  // every rank holds every value
    Tensor& v = rep.gpt.params().flat_values();
    rep.dp.all_gather(comm::device_buf(v.f32() + rep.shard.lo(), rep.shard.shard_elems),
                      comm::Buf(v));
  }
  if (rep.options.bf16 && !rep.values) rep.gpt.params().refresh_bf16();
}
}  // namespace

void load_master_values(Replica& rep, const MasterFill& fill) {
  OptimizerArrays arrays(rep);
  arrays.pull();  // Adam's m and v stay as they are
  for (const Target& t : replica_targets(rep, arrays)) fill(*t.spec, t.lo, t.hi, t.dst[0]);
  arrays.push();
  gather_loaded_values(rep);
}

int64_t resume(const TrainOptions& o, const RankGroups& g, Replica& rep, bool talk,
               int64_t* nonfinite_in_row) {
  if (nonfinite_in_row) *nonfinite_in_row = 0;
  if (o.resume.empty()) return 0;
  const bool is_auto = o.resume == "auto";
  std::vector<std::string> cands;
  if (is_auto) {
    cands = list_checkpoints(o.checkpoint_dir);
    if (cands.empty()) {
      if (talk)
        std::fprintf(stderr, "no checkpoint in %s: starting from scratch\n",
                     o.checkpoint_dir.c_str());
      return 0;
    }
  } else if (fs::exists(fs::path(o.resume) / "index.json")) {
    cands = {o.resume};
  } else {
    cands = list_checkpoints(o.resume);
    if (cands.empty())
      fail(
          "--resume '{}' is neither a checkpoint (no index.json) nor a directory holding one "
          "(step-N); use --resume auto with --checkpoint-dir to start from scratch when "
          "there is none",
          o.resume);
    cands.resize(1);
  }
  const int rank = g.world.rank();
  for (size_t i = 0; i < cands.size(); ++i) {
    std::string err;
    ExitCode code = ExitCode::kBadInput;
    int64_t step = 0, adam_steps = 0;
    std::vector<std::string> changes;  // of this run against the checkpoint's
    const double t0 = now_s();
    int64_t bytes = 0;
    try {
      const Index idx = read_index(cands[i], &o.model);
      if (const std::string why = outer_resume_refusal(cands[i], idx.step, o); !why.empty())
        fail("{}", why);
      if (idx.batch > 0 && idx.batch != o.batch)
        fail(
            "checkpoint '{}' was trained with --batch {} and this run asks for --batch {}: the "
            "data position (step x batch samples) would not continue where it stopped (resume "
            "with --batch {}, or start a new run in another --checkpoint-dir)",
            cands[i], idx.batch, o.batch, idx.batch);
      OptimizerArrays arrays(rep);
      const std::vector<Target> targets = replica_targets(rep, arrays);
      for (const Target& t : targets) bytes += (t.hi - t.lo) * 4 * kArrays;
      load_targets(idx, targets);
      arrays.push();
      if (g.extension) g.extension->load(cands[i], idx.step);
      step = idx.step;
      adam_steps = idx.adam_steps;
      if (nonfinite_in_row) *nonfinite_in_row = idx.nonfinite_in_row;
      const json saved = parse_json(idx.json_text).at("trainer");
      if (talk) changes = resume_changes(saved, step, o);
      if (o.moe.balance_bias) restore_moe_bias(saved, rep.gpt.moe_bias(), idx.dir);
    } catch (const Error& e) {
      err = e.what();
      code = e.code();
    }
    // Every rank learns whether any failed, and the lowest failing rank reports.
    float flags[2] = {err.empty() ? 0.f : 1.f,
                      err.empty() ? 0.f : static_cast<float>(g.world.size() - rank)};
    g.world.all_reduce(comm::Buf(flags, 2), comm::ReduceOp::kMax);
    if (flags[0] == 0) {
      rep.opt->set_steps_taken(adam_steps);
      gather_loaded_values(rep);
      float total = static_cast<float>(bytes);
      g.world.all_reduce(comm::Buf(&total, 1));
      if (talk) {
        const double dt = now_s() - t0;
        std::fprintf(
            stderr, "resumed from checkpoint %s (step %lld; %.1f MB in %.2f s, %.2f GB/s)\n",
            cands[i].c_str(), static_cast<long long>(step), total / 1e6, dt, total / 1e9 / dt);
        for (const std::string& c : changes) std::fprintf(stderr, "resume: %s\n", c.c_str());
      }
      // Every rank loaded the same step, so every rank refuses alike.
      if (step > o.steps)
        fail(
            "checkpoint '{}' is at step {}, past --steps {}: nothing would be trained (use "
            "--steps {} or more to go on from it)",
            cands[i], step, o.steps, step + 1);
      if (step == o.steps && talk)
        std::fprintf(stderr, "checkpoint %s is at --steps %lld already: nothing left to train\n",
                     cands[i].c_str(), static_cast<long long>(step));
      return step;
    }
    // The lowest failing rank's error, on every rank (an explicit --resume throws it).
    const int reporter = static_cast<int>(g.world.size() - flags[1]);
    const std::vector<std::string> errs =
        gather_strings(g.world, fmt::format("{}|{}", static_cast<int>(code), err));
    const std::string& first = errs[static_cast<size_t>(reporter)];
    const std::string message = first.substr(first.find('|') + 1);
    if (!is_auto) throw Error(message, static_cast<ExitCode>(std::stoi(first)));
    if (rank == reporter)
      std::fprintf(stderr, "%swarning: %s%s\n",
                   rank == 0 ? "" : fmt::format("[rank {}] ", rank).c_str(), message.c_str(),
                   i + 1 == cands.size() ? "" : "; trying the previous checkpoint");
  }
  fail(
      "no loadable checkpoint in '{}' ({} found, each damaged or of another model: see the "
      "warnings above); remove them or use another --checkpoint-dir to start from scratch",
      o.checkpoint_dir, cands.size());
}

// How long `pause` holds a rank: a test polling for the moment (a save's .tmp folder) sees it
// even on loaded cores, where a 40 ms save was missed by a 10 ms poll.
constexpr int kFaultPauseSeconds = 3;

void maybe_fault(const char* point, int64_t step, int rank) {
  // MESHTRAIN_FAULT=ACTION@POINT:STEP:RANK[:ONCE_FILE], ACTION kill, throw, pause (the rank
  // sleeps kFaultPauseSeconds and goes on), or a signal to this process (term, int, usr1:
  // the run goes on and stops cleanly), POINT step,
  // save-shards, save-index or save-renamed. With ONCE_FILE: only when that file does not
  // exist (it is created first), so a restarted job runs on.
  static const char* env = std::getenv("MESHTRAIN_FAULT");
  if (!env || !*env) return;
  const std::string spec = env;
  const size_t at = spec.find('@');
  if (at == std::string::npos) return;
  const std::string action = spec.substr(0, at);
  std::vector<std::string> f;
  std::string cur;
  for (char ch : spec.substr(at + 1) + ":") {
    if (ch == ':') {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (f.size() < 3 || f[0] != point || std::stoll(f[1]) != step || std::stoi(f[2]) != rank) return;
  if (f.size() >= 4 && !f[3].empty()) {
    const int fd = ::open(f[3].c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return;  // done once already
    ::fsync(fd);
    ::close(fd);
  }
  // A signal to this process, which goes on (the clean stop of train/stop_signals.h).
  const int signo = action == "term"   ? SIGTERM
                    : action == "int"  ? SIGINT
                    : action == "usr1" ? SIGUSR1
                                       : 0;
  if (signo != 0) {
    std::fprintf(stderr, "[rank %d] MESHTRAIN_FAULT: %s to this process at %s of step %lld\n", rank,
                 action.c_str(), point, static_cast<long long>(step));
    std::fflush(stderr);
    ::kill(::getpid(), signo);
    return;
  }
  if (action == "pause") {  // a window for a test to act in (a save half written), then on
    std::fprintf(stderr, "[rank %d] MESHTRAIN_FAULT: pause of %d s at %s of step %lld\n", rank,
                 kFaultPauseSeconds, point, static_cast<long long>(step));
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(kFaultPauseSeconds));
    return;
  }
  if (action == "kill") {
    std::fprintf(stderr, "[rank %d] MESHTRAIN_FAULT: SIGKILL at %s of step %lld\n", rank, point,
                 static_cast<long long>(step));
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
  fail_run("injected fault (MESHTRAIN_FAULT) at {} of step {} on rank {}", point, step, rank);
}

}  // namespace mt::train::ckpt
