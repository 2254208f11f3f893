// Reading checkpoints (docs/checkpoints.md): the index, checked against what it may hold
// (untrusted input), the pieces into any layout's slices with their checksums, and verify.

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/json.h"
#include "train/checkpoint.h"
#include "train/checkpoint_format.h"
#include "train/json_read.h"
#include "train/nonfinite.h"
#include "train/outer_optimizer.h"
#include "train/trainer.h"

namespace mt::train::ckpt {

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
}  // namespace mt::train::ckpt
