#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nmmintrin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "comm/group.h"
#include "core/clock.h"
#include "core/device.h"
#include "core/error.h"
#include "core/json.h"
#include "core/write_file.h"
#include "parallel/pipeline/schedule.h"
#include "train/json_read.h"
#include "train/nonfinite.h"
#include "train/outer_optimizer.h"
#include "train/pipeline_stage.h"
#include "train/replica.h"
#include "train/resume_changes.h"
#include "train/trainer.h"

namespace mt::train::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- CRC32C -------------------------------------------------------------------------

namespace {

struct CrcTable {
  uint32_t t[256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
      t[i] = c;
    }
  }
};

uint32_t crc32c_sw(const uint8_t* p, size_t n, uint32_t c) {
  static const CrcTable table;
  while (n--) c = table.t[(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const uint8_t* p, size_t n, uint32_t c) {
  // One chained stream, 32 bytes per iteration (about 8 GB/s: faster than the disks).
  uint64_t c64 = c;
  while (n >= 32) {
    uint64_t v[4];
    std::memcpy(v, p, 32);
    c64 = _mm_crc32_u64(c64, v[0]);
    c64 = _mm_crc32_u64(c64, v[1]);
    c64 = _mm_crc32_u64(c64, v[2]);
    c64 = _mm_crc32_u64(c64, v[3]);
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint32_t c = ~crc;
  return ~(have_sse42() ? crc32c_hw(p, bytes, c) : crc32c_sw(p, bytes, c));
}

// ---- small file helpers -------------------------------------------------------------

namespace {

std::string step_name(int64_t step) { return fmt::format("step-{:08}", step); }

void write_all(int fd, const void* data, int64_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_run("writing '{}' failed: {} (disk full?)", path, std::strerror(errno));
    }
    p += n;
    bytes -= n;
  }
}

void pwrite_all(int fd, const void* data, int64_t bytes, int64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n =
        ::pwrite(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_run("writing '{}' failed: {} (disk full?)", path, std::strerror(errno));
    }
    p += n;
    bytes -= n;
    offset += n;
  }
}

// fn(k) for the three arrays at once, on threads of their own; the first error rethrown.
template <typename Fn>
void for_each_array(Fn fn) {
  std::exception_ptr err[kArrays];
  std::vector<std::thread> threads;
  for (int k = 0; k < kArrays; ++k)
    threads.emplace_back([&, k] {
      try {
        fn(k);
      } catch (...) {
        err[k] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

// Reads exactly `bytes` at `offset`; false when the file ends first.
bool read_at(int fd, void* data, int64_t bytes, int64_t offset) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n =
        ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= n;
    offset += n;
  }
  return true;
}

// Reads exactly `bytes` at `offset` and returns their CRC32C in `crc`; false when the file
// ends first. In 4 MiB chunks, each checksummed right after its read (still in the cache),
// with the kernel asked to fetch the next 16 MiB meanwhile (POSIX_FADV_WILLNEED): the disk
// keeps reading while the CPU checksums and copies, where reading a whole piece and then
// checksumming it left the disk idle for the checksum (the 1-rank load was 68% of dd's rate).
bool read_checked(int fd, void* data, int64_t bytes, int64_t offset, uint32_t& crc) {
  constexpr int64_t kChunk = int64_t{4} << 20, kAhead = 4 * kChunk;
  auto* p = static_cast<char*>(data);
  const int64_t end = offset + bytes;
  crc = 0;
  for (int64_t at = offset; at < end; at += kChunk) {
    const int64_t n = std::min(kChunk, end - at);
    if (at + n < end)
      ::posix_fadvise(fd, at + n, std::min(kAhead, end - (at + n)), POSIX_FADV_WILLNEED);
    if (!read_at(fd, p, n, at)) return false;
    crc = crc32c(p, static_cast<size_t>(n), crc);
    p += n;
  }
  return true;
}

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_run("cannot open '{}' to fsync it: {}", path.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_run("fsync of '{}' failed: {}", path.string(), std::strerror(errno));
}

// A small file written atomically: temporary name, fsync, rename, fsync of the directory;
// a failed write leaves no temporary file (io::write_file).
void write_small_atomic(const fs::path& path, const std::string& text) {
  io::write_file(path.string(), text);
}

const char* split_name(model::TpSplit s) {
  switch (s) {
    case model::TpSplit::kReplicated:
      return "replicated";
    case model::TpSplit::kRows:
      return "rows";
    case model::TpSplit::kCols:
      return "cols";
    case model::TpSplit::kBlockRows:
      return "block_rows";
  }
  return "?";
}

model::TpSplit parse_split(const std::string& s, const std::string& where) {
  if (s == "replicated") return model::TpSplit::kReplicated;
  if (s == "rows") return model::TpSplit::kRows;
  if (s == "cols") return model::TpSplit::kCols;
  // "qkv_rows": checkpoints written before grouped-query attention (three equal blocks).
  if (s == "block_rows" || s == "qkv_rows") return model::TpSplit::kBlockRows;
  fail("{}: unknown tp_split '{}'", where, s);
}

json config_json(const model::GptConfig& c) {
  json j = {{"name", c.name},       {"n_layer", c.n_layer}, {"n_head", c.n_head},
            {"d_model", c.d_model}, {"d_ff", c.d_ff},       {"vocab", c.vocab},
            {"seq_len", c.seq_len}, {"bias", c.bias},       {"tied", c.tied}};
  // The block's parts (absent in checkpoints of GPT-2 models written before them).
  j["n_kv_head"] = c.kv_heads();
  j["norm"] = model::norm_name(c.norm);
  j["norm_eps"] = c.norm_eps;
  j["mlp"] = model::mlp_name(c.mlp);
  j["positions"] = model::positions_name(c.positions);
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.llama3)
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  if (c.moe.enabled())  // the mixture of experts (absent: a dense model)
    j["moe"] = {{"n_experts", c.moe.n_experts},
                {"top_k", c.moe.top_k},
                {"every", c.moe.every},
                {"first_dense", c.moe.first_dense},
                {"d_ff_expert", c.moe.d_ff_expert},
                {"d_ff_shared", c.moe.d_ff_shared},
                {"order", model::router_order_name(c.moe.order)}};
  return j;
}

std::string config_text(const model::GptConfig& c) {
  return fmt::format(
             "n_layer {} n_head {} n_kv_head {} d_model {} d_ff {} vocab {} seq_len {} bias {} "
             "tied {} "
             "{} {} {}",
             c.n_layer, c.n_head, c.kv_heads(), c.d_model, c.d_ff, c.vocab, c.seq_len, c.bias,
             c.tied, model::norm_name(c.norm), model::mlp_name(c.mlp),
             model::positions_name(c.positions)) +
         (c.moe.enabled() ? fmt::format(" moe {} experts top {} every {} first_dense {} ff {} "
                                        "shared {} {}",
                                        c.moe.n_experts, c.moe.top_k, c.moe.every,
                                        c.moe.first_dense, c.moe.d_ff_expert, c.moe.d_ff_shared,
                                        model::router_order_name(c.moe.order))
                          : std::string());
}

bool same_model(const model::GptConfig& a, const model::GptConfig& b) { return a.same_model(b); }

// The model's tensors as the saving layout sees them globally (its vocabulary padding).
std::vector<model::ParamSpec> global_specs(model::GptConfig c, int tp) {
  if (tp > 1) c.vocab_pad_multiple = model::tp_vocab_pad(tp);
  return model::gpt_param_specs(c);
}

// ---- one shard file -------------------------------------------------------------------

struct PieceData {
  Piece meta;
  const float* src[kArrays] = {nullptr, nullptr, nullptr};
};

// Writes the pieces as a safetensors file (tensors "master/NAME/LO", "adam_m/...",
// "adam_v/...", 1-D F32), all masters first, then m, then v, in piece order; fills each
// piece's offsets and checksums. fsyncs; returns the file's bytes.
int64_t write_shard(const fs::path& path, std::vector<PieceData>& pieces,
                    const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  header["__metadata__"] = metadata;
  int64_t off = 0;
  std::vector<int64_t> rel(pieces.size() * kArrays);
  for (int k = 0; k < kArrays; ++k)
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& m = pieces[i].meta;
      const int64_t bytes = m.elems() * 4;
      header[fmt::format("{}/{}/{}", kArrayNames[k], m.tensor, m.local_lo)] = {
          {"dtype", "F32"}, {"shape", {m.elems()}}, {"data_offsets", {off, off + bytes}}};
      rel[i * kArrays + k] = off;
      off += bytes;
    }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';
  const int64_t base = 8 + static_cast<int64_t>(text.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    for (int k = 0; k < kArrays; ++k) pieces[i].meta.offset_bytes[k] = base + rel[i * kArrays + k];
  const std::string name = path.string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_run("cannot create checkpoint shard '{}': {}", name, std::strerror(errno));
  const uint64_t n = text.size();
  write_all(fd, &n, 8, name);
  write_all(fd, text.data(), static_cast<int64_t>(text.size()), name);
  // The three arrays are written at once, on three threads (their regions' offsets are
  // known). Pieces adjacent in memory go out in one write, in chunks of at most 64 MiB; each
  // piece's checksum is taken just before (its bytes are then in cache), and the disk is
  // told to start writing each chunk back at once (sync_file_range), so that the fsync at
  // the end finds little left to do and the disk is busy from the first chunk on.
  constexpr int64_t kChunkElems = int64_t{16} << 20;
  for_each_array([&](int k) {
    if (pieces.empty()) return;
    int64_t written = pieces[0].meta.offset_bytes[k];
    auto flush = [&](const float* start, int64_t len) {
      for (int64_t at = 0; at < len; at += kChunkElems) {
        const int64_t bytes = std::min(kChunkElems, len - at) * 4;
        pwrite_all(fd, start + at, bytes, written, name);
        ::sync_file_range(fd, written, bytes, SYNC_FILE_RANGE_WRITE);
        written += bytes;
      }
    };
    const float* start = nullptr;
    int64_t len = 0;
    for (PieceData& p : pieces) {
      p.meta.crc[k] = crc32c(p.src[k], static_cast<size_t>(p.meta.elems()) * 4);
      if (start && start + len == p.src[k] && len + p.meta.elems() <= kChunkElems) {
        len += p.meta.elems();
        continue;
      }
      if (start) flush(start, len);
      start = p.src[k];
      len = p.meta.elems();
    }
    if (start) flush(start, len);
  });
  if (::fsync(fd) != 0) fail_run("fsync of '{}' failed: {}", name, std::strerror(errno));
  if (::close(fd) != 0) fail_run("writing '{}' failed: {}", name, std::strerror(errno));
  return base + off;
}

json piece_json(const Piece& p) {
  json j = {{"tensor", p.tensor},
            {"file", p.file},
            {"tp", {p.tp_rank, p.tp_size}},
            {"local", {p.local_lo, p.local_hi}},
            {"offsets", {p.offset_bytes[0], p.offset_bytes[1], p.offset_bytes[2]}},
            {"crc32c", {p.crc[0], p.crc[1], p.crc[2]}}};
  if (p.ep_size > 1) j["ep"] = {p.ep_rank, p.ep_size};  // experts [r·E/ep, (r+1)·E/ep)
  return j;
}

// A piece's slice of its tensor as a spec: the tensor's global spec split as the saving
// rank held it (tp, then ep for an expert tensor).
model::ParamSpec piece_spec(const Piece& pc, const TensorInfo& ti) {
  model::ParamSpec s;
  s.name = pc.tensor;
  s.shape = ti.shape;
  s.tp_split = ti.tp_split;
  s.row_blocks = ti.row_blocks;
  if (pc.tp_size > 1) s = model::tp_shard_specs({s}, pc.tp_rank, pc.tp_size)[0];
  if (pc.ep_size > 1) {
    s.expert = true;
    s = model::ep_shard_specs({s}, pc.ep_rank, pc.ep_size)[0];
  }
  return s;
}

// The index of a checkpoint: trainer state, model, layout, tensors, files and pieces.
json make_index(int64_t step, const json& trainer, const model::GptConfig& config,
                const json& layout, int tp, const std::vector<FileInfo>& files,
                const std::vector<Piece>& pieces) {
  json tensors = json::object();
  for (const model::ParamSpec& s : global_specs(config, tp))
    tensors[s.name] = {{"shape", s.shape},
                       {"real_rows", s.real_rows},
                       {"tp_split", split_name(s.tp_split)},
                       {"row_blocks", s.row_blocks}};
  json fj = json::array();
  for (const FileInfo& f : files)
    fj.push_back({{"name", f.name}, {"bytes", f.bytes}, {"rank", f.rank}});
  json pj = json::array();
  for (const Piece& p : pieces) pj.push_back(piece_json(p));
  return {{"format", "meshtrain-checkpoint"},
          {"version", 1},
          {"step", step},
          {"trainer", trainer},
          {"config", config_json(config)},
          {"layout", layout},
          {"tensors", tensors},
          {"files", fj},
          {"pieces", pj}};
}

// The step `DIR/latest` names, or -1 (none, or not a step name).
int64_t latest_step(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string line;
  if (!std::getline(in, line) || line.rfind("step-", 0) != 0) return -1;
  int64_t step = -1;
  const char* b = line.data() + 5;
  const auto [end, err] = std::from_chars(b, line.data() + line.size(), step);
  return err == std::errc() && end == line.data() + line.size() ? step : -1;
}

// Moves a finished temporary directory into place, then `latest`, then prunes to `keep`.
// `forward_only`: `latest` is not moved back to an older step than the one it names (an
// offline write beside a newer checkpoint).
void publish(const fs::path& dir, const fs::path& tmp, const std::string& name, int keep,
             int64_t step, int rank, bool forward_only = false) {
  const fs::path final_dir = dir / name;
  fsync_path(tmp);
  maybe_fault("save-index", step, rank);
  if (fs::exists(final_dir)) {  // the same step saved again (a restart): replace it
    const fs::path old = dir / (name + ".old");
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_path(dir);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_path(dir);
  maybe_fault("save-renamed", step, rank);
  if (!forward_only || latest_step(dir) <= step) write_small_atomic(dir / "latest", name + "\n");
  if (keep > 0) {
    const std::vector<std::string> all = list_checkpoints(dir.string());
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove_all(all[i]);
  }
  for (const auto& e : fs::directory_iterator(dir)) {  // leftovers of interrupted saves
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && (n.ends_with(".tmp") || n.ends_with(".old")))
      fs::remove_all(e.path());
  }
  fsync_path(dir);
}

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

}  // namespace

int64_t Index::data_bytes() const {
  int64_t n = 0;
  for (const FileInfo& f : files) n += f.bytes;
  return n;
}

// ---- reading ------------------------------------------------------------------------

namespace {

// The elements of `shape`, or -1 where a dimension is negative or the product overflows.
int64_t checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) return -1;
    n *= d;
  }
  return n;
}

// A shard file's name in the index: a plain file name in the checkpoint directory (a name
// with a '/' or "..", from a damaged or hostile index, would read files outside it).
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

Index read_index(const std::string& dir, const model::GptConfig* expect) {
  Index idx;
  idx.dir = dir;
  const fs::path path = fs::path(dir) / "index.json";
  std::ifstream in(path);
  if (!in)
    fail("checkpoint '{}': no index.json (not a checkpoint, or its save did not finish)", dir);
  std::stringstream ss;
  ss << in.rdbuf();
  idx.json_text = ss.str();
  json j;
  try {
    j = parse_json(idx.json_text);
  } catch (const std::exception& e) {
    fail("checkpoint index '{}' is not valid JSON ({}): the file is damaged", path.string(),
         e.what());
  }
  const std::string where = path.string();
  // Every number is read as an integer in its range (json_read.h): a float or an out-of-range
  // value is refused, not converted.
  auto integer = [&](const json& v, const char* what, int64_t lo, int64_t hi) {
    return json_integer(v, where, what, lo, hi);
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  try {
    if (!j.is_object()) fail("'{}' is not a meshtrain checkpoint index (not a JSON object)", where);
    if (j.at("format").get<std::string>() != "meshtrain-checkpoint")
      fail("'{}' is not a meshtrain checkpoint index (format '{}')", where,
           j.at("format").get<std::string>());
    idx.step = integer(j.at("step"), "step", 0, kMax);
    const json& t = j.at("trainer");
    idx.adam_steps = integer(t.at("adam_steps"), "trainer.adam_steps", 0, kMax);
    idx.seed = json_uint64(t.at("seed"), where, "trainer.seed");
    idx.batch = t.contains("batch") ? integer(t.at("batch"), "trainer.batch", 0, kMax) : 0;
    idx.nonfinite_in_row =
        t.contains("nonfinite_in_row")
            ? integer(t.at("nonfinite_in_row"), "trainer.nonfinite_in_row", 0, kMax)
            : 0;
    const json& c = j.at("config");
    idx.config.name = c.at("name").get<std::string>();
    idx.config.n_layer = integer(c.at("n_layer"), "config.n_layer", 1, kMax);
    idx.config.n_head = integer(c.at("n_head"), "config.n_head", 1, kMax);
    idx.config.d_model = integer(c.at("d_model"), "config.d_model", 1, kMax);
    idx.config.d_ff = integer(c.at("d_ff"), "config.d_ff", 1, kMax);
    idx.config.vocab = integer(c.at("vocab"), "config.vocab", 1, kMax);
    idx.config.seq_len = integer(c.at("seq_len"), "config.seq_len", 1, kMax);
    idx.config.bias = c.at("bias").get<bool>();
    idx.config.tied = c.at("tied").get<bool>();
    idx.config.n_kv_head = c.value("n_kv_head", int64_t{0});
    idx.config.norm = model::parse_norm(c.value("norm", std::string("layernorm")));
    idx.config.norm_eps = c.value("norm_eps", 1e-5f);
    idx.config.mlp = model::parse_mlp(c.value("mlp", std::string("gelu")));
    idx.config.positions = model::parse_positions(c.value("positions", std::string("learned")));
    idx.config.rope_theta = c.value("rope_theta", 10000.0);
    if (c.contains("rope_scaling")) {
      const json& r = c.at("rope_scaling");
      idx.config.rope_scaling.llama3 = true;
      idx.config.rope_scaling.factor = r.at("factor").get<double>();
      idx.config.rope_scaling.low_freq_factor = r.at("low_freq_factor").get<double>();
      idx.config.rope_scaling.high_freq_factor = r.at("high_freq_factor").get<double>();
      idx.config.rope_scaling.original_max_position =
          r.at("original_max_position_embeddings").get<int64_t>();
    }
    if (c.contains("moe")) {
      const json& m = c.at("moe");
      model::MoeConfig& moe = idx.config.moe;
      moe.n_experts = integer(m.at("n_experts"), "config.moe.n_experts", 1, kMax);
      moe.top_k = integer(m.at("top_k"), "config.moe.top_k", 1, kMax);
      moe.every = integer(m.at("every"), "config.moe.every", 1, kMax);
      moe.first_dense = integer(m.at("first_dense"), "config.moe.first_dense", 0, kMax);
      moe.d_ff_expert = integer(m.at("d_ff_expert"), "config.moe.d_ff_expert", 0, kMax);
      moe.d_ff_shared = integer(m.at("d_ff_shared"), "config.moe.d_ff_shared", 0, kMax);
      moe.order = model::parse_router_order(m.at("order").get<std::string>());
    }
    const json& l = j.at("layout");
    idx.dp = static_cast<int>(integer(l.at("dp"), "layout.dp", 1, kMaxInt));
    idx.tp = static_cast<int>(integer(l.at("tp"), "layout.tp", 1, kMaxInt));
    idx.pp = static_cast<int>(integer(l.at("pp"), "layout.pp", 1, kMaxInt));
    idx.zero = static_cast<int>(integer(l.at("zero"), "layout.zero", 0, 3));
    // Written since context parallelism: an older index is a cp 1 layout.
    idx.cp = l.contains("cp") ? static_cast<int>(integer(l.at("cp"), "layout.cp", 1, kMaxInt)) : 1;
    idx.layout_text =
        fmt::format("dp {}{} tp {} pp {} zero {}", idx.dp,
                    idx.cp > 1 ? fmt::format(" cp {}", idx.cp) : "", idx.tp, idx.pp, idx.zero);
    const json& tensors = j.at("tensors");
    if (!tensors.is_object()) fail("'{}': \"tensors\" must be a JSON object", where);
    for (auto& [name, e] : tensors.items()) {
      TensorInfo ti;
      for (const json& d : e.at("shape"))
        ti.shape.push_back(integer(d, "a tensor's shape", 0, kMax));
      ti.real_rows = integer(e.at("real_rows"), "a tensor's real_rows", -1, kMax);
      ti.tp_split = parse_split(e.at("tp_split").get<std::string>(), where);
      if (e.contains("row_blocks")) {
        for (const json& d : e.at("row_blocks"))
          ti.row_blocks.push_back(integer(d, "a tensor's row_blocks", 1, kMax));
      } else if (ti.tp_split == model::TpSplit::kBlockRows) {  // "qkv_rows": q, k, v alike
        if (ti.shape.empty() || ti.shape[0] % 3 != 0)
          fail("{}: '{}' is split as qkv_rows but has {} rows", where, name,
               ti.shape.empty() ? 0 : ti.shape[0]);
        ti.row_blocks.assign(3, ti.shape[0] / 3);
      }
      int64_t block_rows = 0;
      for (const int64_t b : ti.row_blocks) {
        if (b < 1) fail("{}: '{}' has a row block of {} rows", where, name, b);
        block_rows += b;
      }
      if (ti.tp_split == model::TpSplit::kBlockRows &&
          (ti.shape.empty() || block_rows != ti.shape[0]))
        fail("{}: the row blocks of '{}' do not add up to its rows", where, name);
      idx.tensors[name] = ti;
    }
    for (const json& f : j.at("files")) {
      FileInfo fi{f.at("name").get<std::string>(),
                  integer(f.at("bytes"), "a file's bytes", 0, kMax),
                  static_cast<int>(integer(f.at("rank"), "a file's rank", 0, kMaxInt))};
      if (!plain_file_name(fi.name))
        fail("'{}' names shard file '{}': not a file name in the checkpoint directory", where,
             fi.name);
      idx.files.push_back(std::move(fi));
    }
    for (const json& p : j.at("pieces")) {
      Piece pc;
      pc.tensor = p.at("tensor").get<std::string>();
      pc.file = static_cast<int>(integer(p.at("file"), "a piece's file", 0, kMaxInt));
      pc.tp_size = static_cast<int>(integer(p.at("tp").at(1), "a piece's tp size", 1, kMaxInt));
      pc.tp_rank =
          static_cast<int>(integer(p.at("tp").at(0), "a piece's tp rank", 0, pc.tp_size - 1));
      if (p.contains("ep")) {
        pc.ep_size = static_cast<int>(integer(p.at("ep").at(1), "a piece's ep size", 1, kMaxInt));
        pc.ep_rank =
            static_cast<int>(integer(p.at("ep").at(0), "a piece's ep rank", 0, pc.ep_size - 1));
      }
      pc.local_lo = integer(p.at("local").at(0), "a piece's first element", 0, kMax);
      pc.local_hi = integer(p.at("local").at(1), "a piece's end element", pc.local_lo + 1, kMax);
      for (int k = 0; k < kArrays; ++k) {
        pc.offset_bytes[k] = integer(p.at("offsets").at(k), "a piece's offset", 0, kMax);
        pc.crc[k] = static_cast<uint32_t>(integer(p.at("crc32c").at(k), "a piece's CRC32C", 0,
                                                  std::numeric_limits<uint32_t>::max()));
      }
      if (pc.file >= static_cast<int>(idx.files.size()))
        fail("'{}': a piece of '{}' names file {} of {}", where, pc.tensor, pc.file,
             idx.files.size());
      if (!idx.tensors.count(pc.tensor))
        fail("'{}': a piece names tensor '{}', which the index does not list", where, pc.tensor);
      idx.pieces.push_back(std::move(pc));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint index '{}' is malformed: {}", where, e.what());
  }
  idx.json_text = j.dump(2);
  if (expect && !same_model(*expect, idx.config))
    fail(
        "checkpoint '{}' holds another model ({}) than this run's ({}): resume it with the "
        "same model flags, or use another --checkpoint-dir",
        dir, config_text(idx.config), config_text(*expect));
  int64_t data_bytes = 0;
  std::set<std::string> names;
  for (const FileInfo& f : idx.files) {
    // Listed once: the data the index claims is the data the directory holds.
    if (!names.insert(f.name).second)
      fail("checkpoint index '{}' is damaged: it lists shard file '{}' twice", where, f.name);
    const fs::path fp = fs::path(dir) / f.name;
    std::error_code ec;
    const auto size = fs::file_size(fp, ec);
    if (ec)
      fail("checkpoint '{}': shard file '{}' is missing ({})", dir, fp.string(), ec.message());
    if (static_cast<int64_t>(size) != f.bytes)
      fail(
          "checkpoint '{}': shard file '{}' has {} bytes but the index says {} (truncated or "
          "replaced)",
          dir, fp.string(), size, f.bytes);
    data_bytes += f.bytes;  // the sizes on disk: their sum fits
  }

  // The tensors are the model's (global_specs writes them), so that what a reader of this
  // checkpoint allocates for the model is bounded by the shard files it has: every element
  // is saved once, 3 x 4 bytes. Each dimension first: none exceeds the elements the files
  // hold (so the shapes' arithmetic stays in range).
  const std::string damaged = fmt::format("checkpoint index '{}' is damaged", where);
  const model::GptConfig& mc = idx.config;
  if (std::max({mc.n_head, mc.d_model, mc.d_ff, mc.seq_len}) > data_bytes / 12)
    fail(
        "{}: its model ({}) needs more than the {} bytes of its shard files (3 x 4 bytes per "
        "parameter)",
        damaged, config_text(mc), data_bytes);
  try {
    idx.config.validate();
    model::check_tp(idx.config, idx.tp, false);
  } catch (const Error& e) {
    fail("checkpoint index '{}' describes an impossible model or layout: {}", where, e.what());
  }
  // Per block: 2 norms, 4 linears (each with its bias); outside: wte, the position table
  // (GPT-2's learned one; rotary positions have none), the final norm (+ bias), an untied
  // LM head.
  const int64_t per_layer = idx.config.bias ? 12 : 6;
  const int64_t outside = 2 + (idx.config.positions == model::Positions::kLearned ? 1 : 0) +
                          (idx.config.bias ? 1 : 0) + (idx.config.tied ? 0 : 1);
  if (idx.config.n_layer > (static_cast<int64_t>(idx.tensors.size()) - outside) / per_layer)
    fail("{}: its model has {} blocks but it lists only {} tensors", damaged, idx.config.n_layer,
         idx.tensors.size());
  const std::vector<model::ParamSpec> specs = global_specs(idx.config, idx.tp);
  if (specs.size() != idx.tensors.size())
    fail("{}: it lists {} tensors but its model has {}", damaged, idx.tensors.size(), specs.size());
  int64_t model_elems = 0;
  for (const model::ParamSpec& s : specs) {
    auto it = idx.tensors.find(s.name);
    if (it == idx.tensors.end()) fail("{}: its model's tensor '{}' is not listed", damaged, s.name);
    const TensorInfo& ti = it->second;
    if (ti.shape != s.shape || ti.real_rows != s.real_rows || ti.tp_split != s.tp_split)
      fail("{}: tensor '{}' is listed as {} ({}), but its model's is {} ({})", damaged, s.name,
           shape_str(ti.shape), split_name(ti.tp_split), shape_str(s.shape),
           split_name(s.tp_split));
    const int64_t n = checked_numel(s.shape);
    if (n < 0 || n > data_bytes / 12 - model_elems)
      fail(
          "{}: its model ({}) needs more than the {} bytes of its shard files (3 x 4 bytes per "
          "parameter)",
          damaged, config_text(idx.config), data_bytes);
    model_elems += n;
  }
  // Each piece: a slice of its tensor as tp_size ranks split it, within its file, its three
  // arrays overlapping no other's (so that verifying reads each byte once).
  struct Extent {
    int file;
    int64_t begin, end;
    const Piece* piece;
  };
  std::vector<Extent> extents;
  for (const Piece& pc : idx.pieces) {
    model::ParamSpec s;
    try {
      s = piece_spec(pc, idx.tensors.at(pc.tensor));
    } catch (const Error& e) {
      fail("{}: a piece of '{}' is of tp rank {} of {}{}: {}", damaged, pc.tensor, pc.tp_rank,
           pc.tp_size,
           pc.ep_size > 1 ? fmt::format(", ep rank {} of {}", pc.ep_rank, pc.ep_size) : "",
           e.what());
    }
    const int64_t slice = shape_numel(s.shape);
    if (pc.local_hi > slice)
      fail("{}: a piece of '{}' claims elements [{}, {}) of a {}-element slice", damaged, pc.tensor,
           pc.local_lo, pc.local_hi, slice);
    const int64_t bytes = pc.elems() * 4,
                  file_bytes = idx.files[static_cast<size_t>(pc.file)].bytes;
    for (int k = 0; k < kArrays; ++k) {
      if (pc.offset_bytes[k] > file_bytes - bytes)
        fail("{}: {} of a piece of '{}' is bytes [{}, {}) of shard file '{}', which has {}",
             damaged, kArrayNames[k], pc.tensor, pc.offset_bytes[k], pc.offset_bytes[k] + bytes,
             idx.files[static_cast<size_t>(pc.file)].name, file_bytes);
      extents.push_back({pc.file, pc.offset_bytes[k], pc.offset_bytes[k] + bytes, &pc});
    }
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
  });
  for (size_t i = 1; i < extents.size(); ++i)
    if (extents[i].file == extents[i - 1].file && extents[i].begin < extents[i - 1].end)
      fail("{}: pieces of '{}' and '{}' overlap in shard file '{}' (bytes {} and {})", damaged,
           extents[i - 1].piece->tensor, extents[i].piece->tensor,
           idx.files[static_cast<size_t>(extents[i].file)].name, extents[i - 1].begin,
           extents[i].begin);
  return idx;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() != 13 || n.rfind("step-", 0) != 0 || !e.is_directory()) continue;
    if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    found.emplace_back(std::stoll(n.substr(5)), e.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

void load_targets(const Index& idx, const std::vector<Target>& targets) {
  // The global runs each piece covers, per tensor, sorted.
  struct Run {
    int64_t g_lo, g_hi;
    int piece;
    int64_t piece_off;
  };
  std::map<std::string, std::vector<Run>> runs;
  for (const Target& t : targets) runs[t.spec->name];
  for (size_t pi = 0; pi < idx.pieces.size(); ++pi) {
    const Piece& pc = idx.pieces[pi];
    auto it = runs.find(pc.tensor);
    if (it == runs.end()) continue;
    const model::ParamSpec s = piece_spec(pc, idx.tensors.at(pc.tensor));
    if (pc.local_lo < 0 || pc.local_hi > shape_numel(s.shape) || pc.local_lo >= pc.local_hi)
      fail("checkpoint '{}': a piece of '{}' claims elements [{}, {}) of a {}-element slice",
           idx.dir, pc.tensor, pc.local_lo, pc.local_hi, shape_numel(s.shape));
    model::for_each_tp_run(s, [&](int64_t lf, int64_t gf, int64_t len) {
      const int64_t a = std::max(lf, pc.local_lo), b = std::min(lf + len, pc.local_hi);
      if (a < b)
        it->second.push_back({gf + a - lf, gf + b - lf, static_cast<int>(pi), a - pc.local_lo});
    });
  }
  for (auto& [name, v] : runs)
    std::sort(v.begin(), v.end(), [](const Run& x, const Run& y) { return x.g_lo < y.g_lo; });

  struct Copy {
    int64_t piece_off, n;
    float* dst[kArrays];
  };
  std::vector<std::vector<Copy>> by_piece(idx.pieces.size());
  for (const Target& t : targets) {
    const std::string& name = t.spec->name;
    auto ti_it = idx.tensors.find(name);
    if (ti_it == idx.tensors.end())
      fail("checkpoint '{}' has no tensor '{}' (saved from another model?)", idx.dir, name);
    const TensorInfo& ti = ti_it->second;
    const Shape& g = t.spec->full_shape();
    const bool padded_rows = ti.real_rows >= 0;
    const bool compatible = padded_rows
                                ? g.size() == 2 && ti.shape.size() == 2 && g[1] == ti.shape[1] &&
                                      t.spec->real_rows == ti.real_rows
                                : g == ti.shape;
    if (!compatible)
      fail("checkpoint '{}': tensor '{}' has shape {} there but {} in this model", idx.dir, name,
           fmt::join(ti.shape, "x"), fmt::join(g, "x"));
    const int64_t limit = padded_rows ? ti.real_rows * g[1] : shape_numel(g);
    const std::vector<Run>& rv = runs.at(name);
    model::for_each_tp_run(*t.spec, [&](int64_t lf, int64_t gf, int64_t len) {
      const int64_t a = std::max(lf, t.lo), b = std::min(lf + len, t.hi);
      if (a >= b) return;
      int64_t g0 = gf + a - lf, g1 = gf + b - lf, at = a - t.lo;
      if (g1 > limit) {  // vocabulary padding rows: zero in any layout
        const int64_t z = std::max(g0, limit);
        for (int k = 0; k < kArrays; ++k)
          if (t.dst[k]) std::fill(t.dst[k] + at + (z - g0), t.dst[k] + at + (g1 - g0), 0.f);
        g1 = z;
      }
      while (g0 < g1) {
        auto r = std::upper_bound(rv.begin(), rv.end(), g0,
                                  [](int64_t x, const Run& y) { return x < y.g_lo; });
        if (r == rv.begin() || std::prev(r)->g_hi <= g0)
          fail(
              "checkpoint '{}': elements [{}, {}) of tensor '{}' are in no shard (the index does "
              "not cover this layout's slice)",
              idx.dir, g0, g1, name);
        const Run& run = *std::prev(r);
        const int64_t n = std::min(g1, run.g_hi) - g0;
        Copy c{run.piece_off + (g0 - run.g_lo), n, {nullptr, nullptr, nullptr}};
        for (int k = 0; k < kArrays; ++k) c.dst[k] = t.dst[k] ? t.dst[k] + at : nullptr;
        by_piece[static_cast<size_t>(run.piece)].push_back(c);
        g0 += n;
        at += n;
      }
    });
  }

  // Read each needed piece once (straight into the destination when it is all of it),
  // check its checksum, scatter. The three arrays on three threads, each going through
  // the pieces in file order: three sequential streams, which the kernel's readahead keeps
  // ahead of us while we checksum (one stream leaves the disk idle meanwhile).
  std::vector<int> fds(idx.files.size(), -1);
  auto close_all = [&] {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  };
  try {
    for (size_t pi = 0; pi < idx.pieces.size(); ++pi) {
      if (by_piece[pi].empty()) continue;
      const int file = idx.pieces[pi].file;
      if (fds[static_cast<size_t>(file)] >= 0) continue;
      const std::string path =
          (fs::path(idx.dir) / idx.files[static_cast<size_t>(file)].name).string();
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        fail("checkpoint '{}': cannot open shard file '{}': {}", idx.dir, path,
             std::strerror(errno));
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
      fds[static_cast<size_t>(file)] = fd;
    }
    for_each_array([&](int k) {
      std::vector<float> staging;
      for (size_t pi = 0; pi < idx.pieces.size(); ++pi) {
        const std::vector<Copy>& copies = by_piece[pi];
        bool wanted = false;
        for (const Copy& c : copies) wanted = wanted || c.dst[k];
        if (!wanted) continue;
        const Piece& pc = idx.pieces[pi];
        const std::string path =
            (fs::path(idx.dir) / idx.files[static_cast<size_t>(pc.file)].name).string();
        const int fd = fds[static_cast<size_t>(pc.file)];
        const int64_t bytes = pc.elems() * 4;
        const bool direct =
            copies.size() == 1 && copies[0].piece_off == 0 && copies[0].n == pc.elems();
        float* buf = direct ? copies[0].dst[k] : nullptr;
        if (!direct) {
          if (staging.size() < static_cast<size_t>(pc.elems())) staging.resize(pc.elems());
          buf = staging.data();
        }
        uint32_t crc = 0;
        if (!read_checked(fd, buf, bytes, pc.offset_bytes[k], crc))
          fail("checkpoint '{}': shard file '{}' is truncated: {} of '{}' needs bytes [{}, {})",
               idx.dir, path, kArrayNames[k], pc.tensor, pc.offset_bytes[k],
               pc.offset_bytes[k] + bytes);
        if (crc != pc.crc[k])
          fail(
              "checkpoint '{}': shard file '{}' is damaged: {} of '{}' (tp-local elements [{}, "
              "{})) fails its checksum (CRC32C {:08x} in the index, {:08x} read)",
              idx.dir, path, kArrayNames[k], pc.tensor, pc.local_lo, pc.local_hi, pc.crc[k], crc);
        if (!direct)
          for (const Copy& c : copies)
            if (c.dst[k]) std::memcpy(c.dst[k], buf + c.piece_off, static_cast<size_t>(c.n) * 4);
      }
    });
  } catch (...) {
    close_all();
    throw;
  }
  close_all();
}

std::vector<std::string> verify(const Index& idx) {
  std::vector<std::string> problems;
  std::vector<float> buf;
  for (size_t fi = 0; fi < idx.files.size(); ++fi) {
    const std::string path = (fs::path(idx.dir) / idx.files[fi].name).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      problems.push_back(fmt::format("'{}': cannot open: {}", path, std::strerror(errno)));
      continue;
    }
    for (const Piece& pc : idx.pieces) {
      if (pc.file != static_cast<int>(fi)) continue;
      buf.resize(static_cast<size_t>(pc.elems()));
      for (int k = 0; k < kArrays; ++k) {
        if (!read_at(fd, buf.data(), pc.elems() * 4, pc.offset_bytes[k])) {
          problems.push_back(fmt::format("'{}': truncated: {} of '{}' needs bytes [{}, {})", path,
                                         kArrayNames[k], pc.tensor, pc.offset_bytes[k],
                                         pc.offset_bytes[k] + pc.elems() * 4));
          continue;
        }
        const uint32_t crc = crc32c(buf.data(), static_cast<size_t>(pc.elems()) * 4);
        if (crc != pc.crc[k])
          problems.push_back(fmt::format(
              "'{}': {} of '{}' (tp-local elements [{}, {})) fails its checksum (index {:08x}, "
              "read {:08x})",
              path, kArrayNames[k], pc.tensor, pc.local_lo, pc.local_hi, pc.crc[k], crc));
      }
    }
    ::close(fd);
  }
  return problems;
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

void maybe_fault(const char* point, int64_t step, int rank) {
  // MESHTRAIN_FAULT=ACTION@POINT:STEP:RANK[:ONCE_FILE], ACTION kill, throw, or a signal to
  // this process (term, int, usr1: the run goes on and stops cleanly), POINT step,
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
  if (action == "kill") {
    std::fprintf(stderr, "[rank %d] MESHTRAIN_FAULT: SIGKILL at %s of step %lld\n", rank, point,
                 static_cast<long long>(step));
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
  fail_run("injected fault (MESHTRAIN_FAULT) at {} of step {} on rank {}", point, step, rank);
}

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
