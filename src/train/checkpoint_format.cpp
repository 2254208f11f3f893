// The checkpoint's files (docs/checkpoints.md): CRC32C, a shard file written in safetensors
// layout, the index, and the publication of a finished save (rename, `latest`, pruning).
// Shared by the save, the reads and the offline rewrites (checkpoint_format.h).
#include "train/checkpoint_format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nmmintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/write_file.h"
#include "train/hf_export.h"
#include "train/outer_optimizer.h"
#include "train/replica.h"

namespace mt::train::ckpt {

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

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_run("cannot open '{}' to fsync it: {}", path.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_run("fsync of '{}' failed: {}", path.string(), std::strerror(errno));
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
  if (c.rope_scaling.llama3) j["rope_scaling"] = hf_rope_scaling(c.rope_scaling);
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

}  // namespace

std::string step_name(int64_t step) { return fmt::format("step-{:08}", step); }

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

std::vector<model::ParamSpec> global_specs(model::GptConfig c, int tp) {
  if (tp > 1) c.vocab_pad_multiple = model::tp_vocab_pad(tp);
  return model::gpt_param_specs(c);
}

// ---- one shard file -------------------------------------------------------------------

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

void publish(const fs::path& dir, const fs::path& tmp, const std::string& name, int keep,
             int64_t step, int rank, bool forward_only) {
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

}  // namespace mt::train::ckpt
