#include "plan/hardware.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/error.h"
#include "core/json.h"
#include "plan/measured_h100.h"

namespace mt::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The shortest a GPU kernel runs, launch and tail together: a few microseconds for a CUDA
// kernel launched from the host (no CUDA graphs), the order NVIDIA's CUDA Graphs material
// gives. An estimate, not measured here; it only matters for small layers.
constexpr double kLaunchS = 4e-6;
constexpr const char* kLaunchSource =
    "estimate: a CUDA launch from the host is a few microseconds (not measured here)";

// Numbers and sources: docs/planner.md, "Hardware presets".
ClusterSpec dgx(const char* name, GpuSpec gpu, double nvlink_bytes_per_s, double ib_bytes_per_s) {
  ClusterSpec c;
  c.name = name;
  c.gpu = std::move(gpu);
  c.gpus_per_node = 8;
  c.intra_bytes_per_s = nvlink_bytes_per_s;
  c.intra_latency_s = 4e-6;
  c.inter_bytes_per_s = ib_bytes_per_s;
  c.inter_latency_s = 8e-6;
  return c;
}

GpuSpec a100_80gb() {
  GpuSpec g;
  g.name = "A100-SXM4-80GB";
  g.peak_flops_bf16 = 312e12;
  g.peak_flops_f32 = 19.5e12;
  g.hbm_bytes = 80 * kGiB;
  g.hbm_bytes_per_s = 2.039e12;
  // Fitted to Narayanan et al. 2021 Table 1 by a grid search (docs/planner.md, "Calibration
  // of the A100 curve"; refitted when the model gained 2021's unfused gradient accumulation).
  g.gemm = GemmCurve{0.78, 96};
  g.hbm_efficiency = 0.7;
  g.kernel_overhead_s = 0;
  g.kernel_launch_s = kLaunchS;
  g.sources = {
      {"gemm", "fitted to Narayanan et al. 2021 Table 1 (docs/planner.md, calibration)"},
      {"hbm_efficiency", "fitted with the GEMM curve to Narayanan et al. 2021 Table 1"},
      {"attention", "none: fused attention on the GEMM curve (no published A100 table at hand)"},
      {"kernel_launch_s", kLaunchSource}};
  return g;
}

GpuSpec h100_sxm() {
  GpuSpec g;
  g.name = "H100-SXM5-80GB";
  g.peak_flops_bf16 = 989e12;
  g.peak_flops_f32 = 67e12;
  g.hbm_bytes = 80 * kGiB;
  g.hbm_bytes_per_s = 3.35e12;
  g.gemm = GemmCurve{0.70, 64};  // not fitted: an estimate (docs/planner.md)
  g.hbm_efficiency = 0.7;
  g.kernel_launch_s = kLaunchS;
  g.sources = {{"gemm", "estimate from the data sheet (eff_max 0.70, d0 64), not fitted"},
               {"hbm_efficiency",
                "estimate (0.7; a device-to-device copy reached 0.9 on our "
                "lent H100, elementwise kernels reach less)"},
               {"attention",
                "none: fused attention on the GEMM curve; the published cuDNN "
                "rates (h100_cudnn_attention) are not used by default, see "
                "docs/planner.md \"Kernel costs\""},
               {"kernel_launch_s", kLaunchSource}};
  return g;
}

// The H100 with its kernel costs measured on a lent H100 80GB HBM3 (measured_h100.h): GEMM
// efficiency by shape, fused attention, elementwise bandwidth and the launch floor, each at its
// burst rate, times the fraction of the burst rate a GEMM keeps under sustained load (the
// clock falls to what 700 W allows). Nothing in it is fitted to a published run.
GpuSpec h100_sxm_measured() {
  GpuSpec g = h100_sxm();
  g.name = "H100-SXM5-80GB (measured kernels)";
  g.gemm_table = h100_measured_gemm_table();
  g.attention = h100_measured_attention();
  g.hbm_efficiency = h100_measured_hbm_efficiency();
  g.kernel_launch_s = h100_measured_launch_s();
  g.compute_sustain = h100_measured_compute_sustain();
  const std::string src = h100_measured_source();
  g.sources["gemm_table"] = "torch.matmul bf16 (cuBLAS) by (m, n, k), " + src;
  g.sources["attention"] = "torch scaled_dot_product_attention, causal, head dim 128, " + src;
  g.sources["hbm_efficiency"] = "torch.add over 1 GiB / 3.35 TB/s, " + src;
  g.sources["kernel_launch_s"] = "meshtrain calibrate --device cuda, " + src;
  g.sources["compute_sustain"] =
      "sustained / burst rate of bf16 GEMMs over 30 s at the 700 W limit, " + src;
  return g;
}

GpuSpec b200() {
  GpuSpec g;
  g.name = "B200-180GB";
  g.peak_flops_bf16 = 2.25e15;
  g.peak_flops_f32 = 75e12;
  g.hbm_bytes = 180e9;
  g.hbm_bytes_per_s = 7.7e12;
  g.gemm = GemmCurve{0.65, 96};  // not fitted: an estimate (docs/planner.md)
  g.hbm_efficiency = 0.7;
  g.kernel_launch_s = kLaunchS;
  g.sources = {{"gemm", "estimate from the data sheet (eff_max 0.65, d0 96), not fitted"},
               {"hbm_efficiency", "estimate (0.7)"},
               {"attention", "none: fused attention on the GEMM curve"},
               {"kernel_launch_s", kLaunchSource}};
  return g;
}

nlohmann::json gpu_json(const GpuSpec& g) {
  return {{"name", g.name},
          {"peak_flops_bf16", g.peak_flops_bf16},
          {"peak_flops_f32", g.peak_flops_f32},
          {"hbm_bytes", g.hbm_bytes},
          {"hbm_bytes_per_s", g.hbm_bytes_per_s},
          {"hbm_efficiency", g.hbm_efficiency},
          {"gemm_eff_max", g.gemm.eff_max},
          {"gemm_d0", g.gemm.d0},
          {"kernel_overhead_s", g.kernel_overhead_s},
          {"kernel_launch_s", g.kernel_launch_s},
          {"compute_sustain", g.compute_sustain},
          {"gemm_table",
           {{"dtype", g.gemm_table.dtype},
            {"m", g.gemm_table.m},
            {"n", g.gemm_table.n},
            {"k", g.gemm_table.k},
            {"efficiency", g.gemm_table.efficiency}}},
          {"attention",
           {{"head_dim", g.attention.head_dim},
            {"seq", g.attention.seq},
            {"fwd_flops_per_s", g.attention.fwd_flops_per_s},
            {"bwd_flops_per_s", g.attention.bwd_flops_per_s}}},
          {"sources", g.sources}};
}

}  // namespace

double GemmTable::at(double M, double N, double K) const {
  // Position of x on an axis: the lower index and the weight of the next point, in log2;
  // `below` is how far under the first point x lies (1 when on or above it).
  struct Pos {
    size_t i = 0;
    double w = 0, below = 1;
  };
  auto locate = [](const std::vector<double>& g, double x) {
    Pos p;
    if (x <= g.front()) {
      p.below = std::max(x, 1e-9) / g.front();
      return p;
    }
    if (x >= g.back()) {
      p.i = g.size() - 1;
      return p;
    }
    while (p.i + 1 < g.size() && g[p.i + 1] <= x) ++p.i;
    if (p.i + 1 < g.size())
      p.w = (std::log2(x) - std::log2(g[p.i])) / (std::log2(g[p.i + 1]) - std::log2(g[p.i]));
    return p;
  };
  const Pos a = locate(m, M), b = locate(n, N), c = locate(k, K);
  const size_t nn = n.size(), nk = k.size();
  double e = 0;
  for (int di = 0; di < 2; ++di)
    for (int dj = 0; dj < 2; ++dj)
      for (int dk = 0; dk < 2; ++dk) {
        const double w = (di ? a.w : 1 - a.w) * (dj ? b.w : 1 - b.w) * (dk ? c.w : 1 - c.w);
        if (w == 0) continue;
        e += w * efficiency[((a.i + di) * nn + (b.i + dj)) * nk + (c.i + dk)];
      }
  return e * a.below * b.below * c.below;
}

GemmCurve fit_gemm_curve(const std::vector<std::array<double, 4>>& points) {
  GemmCurve best;
  double best_err = 1e300;
  for (double em = 0.30; em <= 1.001; em += 0.01)
    for (double d0 = 0; d0 <= 256; d0 += 4) {
      const GemmCurve g{em, d0};
      double err = 0;
      for (const auto& p : points)
        err += std::pow(std::log(g.efficiency(p[0], p[1], p[2]) / p[3]), 2);
      if (err < best_err) best_err = err, best = g;
    }
  return best;
}

double GpuSpec::gemm_efficiency(double M, double N, double K, const std::string& dtype) const {
  const bool mixed = dtype != "f32";
  if (!gemm_table.empty() && mixed == (gemm_table.dtype != "f32"))
    return compute_sustain * gemm_table.at(M, N, K);
  return gemm.efficiency(M, N, K);
}

AttentionRates h100_cudnn_attention() {
  // cuDNN's fused attention (what Transformer Engine runs on H100), head dim 128, BF16:
  // Shah et al. 2024 (FlashAttention-3, arXiv:2407.08608) Figure 5 (forward, causal) and
  // Figure 6 (backward; the paper plots it without the causal mask only).
  AttentionRates r;
  r.head_dim = 128;
  r.seq = {512, 1024, 2048, 4096, 8192, 16384};
  r.fwd_flops_per_s = {315e12, 410e12, 484e12, 518e12, 529e12, 539e12};
  r.bwd_flops_per_s = {305e12, 408e12, 465e12, 499e12, 518e12, 516e12};
  return r;
}

double AttentionRates::at(const std::vector<double>& seq, const std::vector<double>& rate,
                          double s) {
  if (s <= seq.front()) return rate.front();
  if (s >= seq.back()) return rate.back();
  size_t i = 1;
  while (seq[i] < s) ++i;
  const double w = std::log2(s / seq[i - 1]) / std::log2(seq[i] / seq[i - 1]);
  return rate[i - 1] + w * (rate[i] - rate[i - 1]);
}

double GpuSpec::peak_flops(const std::string& dtype) const {
  if (dtype == "f32") return peak_flops_f32;
  return peak_flops_bf16;  // bf16, fp16
}

std::vector<std::string> cluster_preset_names() {
  return {"dgx-a100", "dgx-h100", "dgx-h100-measured", "hgx-b200", "this-host"};
}

std::string this_host_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? xdg : (home ? std::string(home) + "/.cache" : "/tmp");
  return base + "/meshtrain/this-host.json";
}

ClusterSpec cluster_preset(const std::string& name) {
  // NVLink 3/4/5: 600/900/1800 GB/s per GPU both directions together; IB per GPU rail:
  // HDR 200 Gb/s (DGX A100), NDR 400 Gb/s (DGX H100, HGX B200 with ConnectX-7).
  // Achieved, not nominal: NCCL's ring bus bandwidth on NVLink is ~77-80% of the link
  // (A100: ~230 of 300 GB/s), an IB rail ~90% of its line rate (docs/planner.md).
  if (name == "dgx-a100") return dgx("dgx-a100", a100_80gb(), 230e9, 22.5e9);
  if (name == "dgx-h100") return dgx("dgx-h100", h100_sxm(), 360e9, 45e9);
  if (name == "dgx-h100-measured")
    return dgx("dgx-h100-measured", h100_sxm_measured(), 360e9, 45e9);
  if (name == "hgx-b200") return dgx("hgx-b200", b200(), 720e9, 45e9);
  std::string path = name == "this-host" ? this_host_path() : name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (name == "this-host")
      fail("--cluster this-host: no calibration at {} (run `meshtrain calibrate` first)", path);
    fail("unknown cluster '{}' (choose one of {}, or give a JSON file)", name,
         fmt::join(cluster_preset_names(), ", "));
  }
  if (std::filesystem::is_directory(path, ec))
    fail("--cluster '{}' is a folder: give a cluster JSON file (as `meshtrain calibrate` writes)",
         path);
  std::ifstream in(path);
  if (!in)
    fail("--cluster: cannot read cluster file '{}': {} (check its permissions)", path,
         std::strerror(errno));
  try {
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    return cluster_from_json(parse_json(text));
  } catch (const nlohmann::json::exception& e) {
    fail("cluster file '{}' is not a valid cluster spec: {}", path, e.what());
  } catch (const Error& e) {
    fail("cluster file '{}': {}", path, e.what());
  } catch (const std::exception& e) {  // a read error (std::ios_base::failure)
    fail("--cluster: cannot read cluster file '{}': {}", path, e.what());
  }
}

nlohmann::json to_json(const ClusterSpec& c) {
  nlohmann::json links = nlohmann::json::array();
  for (const HostLink& h : c.host_links)
    links.push_back(
        {{"ranks", h.ranks}, {"latency_s", h.latency_s}, {"bytes_per_s", h.bytes_per_s}});
  nlohmann::json j = {{"name", c.name},
                      {"gpu", gpu_json(c.gpu)},
                      {"gpus_per_node", c.gpus_per_node},
                      {"max_nodes", c.max_nodes},
                      {"intra_bytes_per_s", c.intra_bytes_per_s},
                      {"intra_latency_s", c.intra_latency_s},
                      {"inter_bytes_per_s", c.inter_bytes_per_s},
                      {"inter_latency_s", c.inter_latency_s},
                      {"compute_units", c.compute_units},
                      {"backend", c.backend},
                      {"host_links", links}};
  if (!c.inter_curve.empty())  // only when measured, as the site link
    j["inter_curve"] = {{"ranks", c.inter_curve.ranks},
                        {"bytes", c.inter_curve.bytes},
                        {"seconds", c.inter_curve.seconds}};
  if (c.site_bytes_per_s > 0) {  // written only when given: older files stay as they were
    j["site_bytes_per_s"] = c.site_bytes_per_s;
    j["site_latency_s"] = c.site_latency_s;
  }
  return j;
}

namespace {
// A count read as one: 8.5 GPUs per node is refused, not truncated to 8, and 2^32 + 8 is
// refused, not wrapped to 8 in an int.
int64_t count(const nlohmann::json& v, const char* field,
              int64_t max = std::numeric_limits<int>::max()) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(max)
                              : v.get<int64_t>() > max))
    fail(
        "{} is {}; it must be a whole number up to {}: fix the file (or rerun `meshtrain "
        "calibrate`)",
        field, v.dump(), max);
  return v.get<int64_t>();
}
}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j) {
  ClusterSpec c;
  c.name = j.at("name").get<std::string>();
  const auto& g = j.at("gpu");
  c.gpu.name = g.at("name").get<std::string>();
  c.gpu.peak_flops_bf16 = g.at("peak_flops_bf16").get<double>();
  c.gpu.peak_flops_f32 = g.at("peak_flops_f32").get<double>();
  c.gpu.hbm_bytes = g.at("hbm_bytes").get<double>();
  c.gpu.hbm_bytes_per_s = g.at("hbm_bytes_per_s").get<double>();
  c.gpu.hbm_efficiency = g.value("hbm_efficiency", 0.7);
  c.gpu.gemm.eff_max = g.value("gemm_eff_max", 0.75);
  c.gpu.gemm.d0 = g.value("gemm_d0", 48.0);
  c.gpu.kernel_overhead_s = g.value("kernel_overhead_s", 0.0);
  c.gpu.kernel_launch_s = g.value("kernel_launch_s", 0.0);
  c.gpu.compute_sustain = g.value("compute_sustain", 1.0);
  if (g.contains("gemm_table")) {
    const auto& t = g.at("gemm_table");
    c.gpu.gemm_table.dtype = t.value("dtype", std::string("bf16"));
    c.gpu.gemm_table.m = t.at("m").get<std::vector<double>>();
    c.gpu.gemm_table.n = t.at("n").get<std::vector<double>>();
    c.gpu.gemm_table.k = t.at("k").get<std::vector<double>>();
    c.gpu.gemm_table.efficiency = t.at("efficiency").get<std::vector<double>>();
  }
  if (g.contains("attention")) {
    const auto& a = g.at("attention");
    c.gpu.attention.head_dim = int(count(a.at("head_dim"), "gpu.attention.head_dim"));
    c.gpu.attention.seq = a.at("seq").get<std::vector<double>>();
    c.gpu.attention.fwd_flops_per_s = a.at("fwd_flops_per_s").get<std::vector<double>>();
    c.gpu.attention.bwd_flops_per_s = a.at("bwd_flops_per_s").get<std::vector<double>>();
  }
  if (g.contains("sources"))
    c.gpu.sources = g.at("sources").get<std::map<std::string, std::string>>();
  c.gpus_per_node = int(count(j.at("gpus_per_node"), "gpus_per_node"));
  c.max_nodes = j.contains("max_nodes")
                    ? count(j.at("max_nodes"), "max_nodes", std::numeric_limits<int64_t>::max())
                    : 0;
  c.intra_bytes_per_s = j.at("intra_bytes_per_s").get<double>();
  c.intra_latency_s = j.value("intra_latency_s", 0.0);
  c.inter_bytes_per_s = j.at("inter_bytes_per_s").get<double>();
  c.inter_latency_s = j.value("inter_latency_s", 0.0);
  c.compute_units =
      j.contains("compute_units") ? int(count(j.at("compute_units"), "compute_units")) : 0;
  c.backend = j.value("backend", std::string());
  c.site_bytes_per_s = j.value("site_bytes_per_s", 0.0);
  c.site_latency_s = j.value("site_latency_s", 0.0);
  if (j.contains("host_links"))
    for (const auto& h : j.at("host_links"))
      c.host_links.push_back({int(count(h.at("ranks"), "host_links.ranks")),
                              h.at("latency_s").get<double>(), h.at("bytes_per_s").get<double>()});
  std::sort(c.host_links.begin(), c.host_links.end(),
            [](const HostLink& a, const HostLink& b) { return a.ranks < b.ranks; });
  if (j.contains("inter_curve")) {
    const auto& k = j.at("inter_curve");
    c.inter_curve.ranks = int(count(k.at("ranks"), "inter_curve.ranks"));
    c.inter_curve.bytes = k.at("bytes").get<std::vector<double>>();
    c.inter_curve.seconds = k.at("seconds").get<std::vector<double>>();
  }
  validate(c);
  return c;
}

void validate(const ClusterSpec& c) {
  // Each rate divides a cost and each size bounds memory: 0 would make the step "inf" and
  // MFU NaN. Latencies, overheads, d0 (calibrate may fit 0), max_nodes (0: unlimited) and
  // compute_units (0: a GPU per rank) may be 0.
  auto check = [&](const char* field, double v, bool zero_ok, const char* what) {
    if (!(v > 0 || (zero_ok && v == 0)))
      fail("{} is {}; it must be {} ({}): fix the file (or rerun `meshtrain calibrate`)", field, v,
           zero_ok ? "0 or more" : "positive", what);
  };
  check("gpu.peak_flops_bf16", c.gpu.peak_flops_bf16, false, "dense FLOP/s, e.g. 3.12e14");
  check("gpu.peak_flops_f32", c.gpu.peak_flops_f32, false, "dense FLOP/s, e.g. 1.95e13");
  check("gpu.hbm_bytes", c.gpu.hbm_bytes, false, "memory per GPU in bytes");
  check("gpu.hbm_bytes_per_s", c.gpu.hbm_bytes_per_s, false, "memory bandwidth, bytes/s");
  check("gpu.hbm_efficiency", c.gpu.hbm_efficiency, false, "achieved fraction, up to 1");
  check("gpu.gemm_eff_max", c.gpu.gemm.eff_max, false, "achieved fraction, up to 1");
  check("gpu.gemm_d0", c.gpu.gemm.d0, true, "GEMM dimension");
  check("gpu.kernel_overhead_s", c.gpu.kernel_overhead_s, true, "seconds");
  check("gpu.kernel_launch_s", c.gpu.kernel_launch_s, true, "seconds");
  check("gpu.compute_sustain", c.gpu.compute_sustain, false,
        "the fraction of burst rates kept under sustained load, up to 1");
  const AttentionRates& a = c.gpu.attention;
  if (a.fwd_flops_per_s.size() != a.seq.size() || a.bwd_flops_per_s.size() != a.seq.size())
    fail(
        "gpu.attention has {} sequence lengths, {} forward and {} backward rates; give one rate "
        "of each per sequence length: fix the file",
        a.seq.size(), a.fwd_flops_per_s.size(), a.bwd_flops_per_s.size());
  if (!a.empty()) check("gpu.attention.head_dim", a.head_dim, false, "an integer, at least 1");
  for (size_t i = 0; i < a.seq.size(); ++i) {
    check("gpu.attention.seq[]", a.seq[i], false, "sequence length, ascending");
    check("gpu.attention.fwd_flops_per_s[]", a.fwd_flops_per_s[i], false, "FLOP/s");
    check("gpu.attention.bwd_flops_per_s[]", a.bwd_flops_per_s[i], false, "FLOP/s");
    if (i > 0 && !(a.seq[i] > a.seq[i - 1]))
      fail("gpu.attention.seq must ascend ({} after {}): fix the file", a.seq[i], a.seq[i - 1]);
  }
  const GemmTable& t = c.gpu.gemm_table;
  if (!t.empty() || !t.m.empty()) {
    if (t.dtype != "bf16" && t.dtype != "f32")
      fail("gpu.gemm_table.dtype is \"{}\"; it must be bf16 or f32: fix the file", t.dtype);
    if (t.efficiency.size() != t.m.size() * t.n.size() * t.k.size())
      fail(
          "gpu.gemm_table has {} x {} x {} grid points but {} efficiencies; give one per (m, n, "
          "k), row-major: fix the file (or rerun `meshtrain calibrate --device cuda`)",
          t.m.size(), t.n.size(), t.k.size(), t.efficiency.size());
    for (const auto& [axis, v] : {std::pair{"m", &t.m}, {"n", &t.n}, {"k", &t.k}})
      for (size_t i = 0; i < v->size(); ++i)
        if (!((*v)[i] >= 1) || (i > 0 && !((*v)[i] > (*v)[i - 1])))
          fail("gpu.gemm_table.{} must ascend from 1 or more ({} at index {}): fix the file", axis,
               (*v)[i], i);
    for (double e : t.efficiency)
      if (!(e > 0 && e <= 1 + 1e-6))
        fail(
            "gpu.gemm_table.efficiency holds {}; each must be in (0, 1], an achieved fraction "
            "of the peak: fix the file",
            e);
  }
  // Achieved fractions of a peak (calibrate's fit reaches 1.0 by summing 0.01 steps).
  for (auto [field, v] : {std::pair{"gpu.hbm_efficiency", c.gpu.hbm_efficiency},
                          {"gpu.gemm_eff_max", c.gpu.gemm.eff_max},
                          {"gpu.compute_sustain", c.gpu.compute_sustain}})
    if (v > 1 + 1e-6)
      fail("{} is {}; it must be at most 1 (an achieved fraction of the peak): fix the file", field,
           v);
  check("gpus_per_node", c.gpus_per_node, false, "an integer, at least 1");
  check("max_nodes", double(c.max_nodes), true, "0: unlimited");
  check("intra_bytes_per_s", c.intra_bytes_per_s, false, "bytes/s per GPU within a node");
  check("intra_latency_s", c.intra_latency_s, true, "seconds");
  check("inter_bytes_per_s", c.inter_bytes_per_s, false, "bytes/s per GPU between nodes");
  check("inter_latency_s", c.inter_latency_s, true, "seconds");
  check("compute_units", c.compute_units, true, "cores shared by the ranks; 0: a GPU each");
  check("site_bytes_per_s", c.site_bytes_per_s, true, "bytes/s each way between sites; 0: none");
  check("site_latency_s", c.site_latency_s, true, "seconds per message between sites");
  if (c.inter_curve.ranks != 0 || !c.inter_curve.bytes.empty()) {
    const LinkCurve& k = c.inter_curve;
    if (k.ranks < 2 || k.bytes.empty() || k.bytes.size() != k.seconds.size())
      fail(
          "cluster file: inter_curve needs ranks >= 2 (it is {}) and as many seconds as bytes "
          "({} and {}), at least one of each: fix the file or rerun `meshtrain calibrate` "
          "across the hosts",
          k.ranks, k.seconds.size(), k.bytes.size());
    for (size_t i = 0; i < k.bytes.size(); ++i) {
      check("inter_curve.bytes[]", k.bytes[i], false, "bytes per rank");
      check("inter_curve.seconds[]", k.seconds[i], false, "seconds");
      if (i > 0 && k.bytes[i] <= k.bytes[i - 1])
        fail(
            "cluster file: inter_curve.bytes must ascend, but {} follows {}: fix the file or "
            "rerun `meshtrain calibrate` across the hosts",
            k.bytes[i], k.bytes[i - 1]);
    }
  }
  for (const HostLink& h : c.host_links) {
    check("host_links[].ranks", h.ranks, false, "rank count");
    check("host_links[].latency_s", h.latency_s, true, "seconds");
    check("host_links[].bytes_per_s", h.bytes_per_s, false, "all-reduce bus bandwidth, bytes/s");
  }
}

double LinkCurve::at(double b) const {
  if (b <= bytes.front()) return seconds.front();
  if (b >= bytes.back()) return seconds.back() * b / bytes.back();
  size_t i = 1;
  while (bytes[i] < b) ++i;
  const double w = std::log(b / bytes[i - 1]) / std::log(bytes[i] / bytes[i - 1]);
  return std::exp(std::log(seconds[i - 1]) + w * (std::log(seconds[i]) - std::log(seconds[i - 1])));
}

ClusterSpec ClusterSpec::for_job(int64_t ranks) const {
  ClusterSpec c = *this;
  // A shared host's ranks share its memory as they share its cores: each fits in its part.
  if (compute_units > 0 && ranks > 1) c.gpu.hbm_bytes /= double(ranks);
  if (host_links.empty()) return c;
  const HostLink* lo = &host_links.front();
  const HostLink* hi = &host_links.back();
  for (const HostLink& h : host_links) {
    if (h.ranks <= ranks) lo = &h;
    if (h.ranks >= ranks && hi->ranks >= h.ranks) hi = &h;
  }
  if (lo->ranks > hi->ranks) lo = hi;  // below the first measured count
  const double w =
      hi->ranks == lo->ranks ? 0.0 : double(ranks - lo->ranks) / double(hi->ranks - lo->ranks);
  const double w1 = std::clamp(w, 0.0, 1.0);
  c.intra_latency_s = c.inter_latency_s = lo->latency_s + w1 * (hi->latency_s - lo->latency_s);
  c.intra_bytes_per_s = c.inter_bytes_per_s =
      lo->bytes_per_s + w1 * (hi->bytes_per_s - lo->bytes_per_s);
  return c;
}

}  // namespace mt::plan
