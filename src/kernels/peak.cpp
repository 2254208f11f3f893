#include "kernels/peak.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace mt::kernels {
namespace {

std::mutex g_mutex;
std::map<std::pair<DType, int>, double> g_known;  // this process's values

}  // namespace

// A home directory outlives the machine under it (a VM moved to another host, a shared
// $HOME): a peak measured on another CPU would make MFU wrong by the ratio of the two, so a
// cache recorded for another CPU is ignored.
std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, id;
  uint64_t flags_hash = 1469598103934665603ull;  // FNV-1a: stable across builds
  while (std::getline(in, line)) {
    if (line.empty()) break;  // the first processor's block is enough
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = line.substr(std::min(line.size(), colon + 2));
    if (key == "model name" || key == "cpu family" || key == "model" || key == "stepping")
      id += (id.empty() ? "" : " / ") + value;
    if (key == "flags")
      for (unsigned char c : value) flags_hash = (flags_hash ^ c) * 1099511628211ull;
  }
  return fmt::format("{} / flags {:016x} / {} cpus", id, flags_hash,
                     ::sysconf(_SC_NPROCESSORS_ONLN));
}

namespace {

nlohmann::json read_cache() {
  std::ifstream in(peak_cache_path());
  const auto fresh = [] { return nlohmann::json{{"cpu", cpu_identity()}}; };
  if (!in) return fresh();
  try {
    auto j = nlohmann::json::parse(in);
    if (!j.is_object() || !j.contains("cpu") || j["cpu"] != cpu_identity()) return fresh();
    return j;
  } catch (const std::exception&) {
    return fresh();  // a damaged cache is re-measured, not fatal
  }
}

void write_cache(const nlohmann::json& j) {
  const std::filesystem::path path = peak_cache_path();
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  // Write a temporary file and rename: a reader never sees half a file.
  const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) return;  // an unwritable cache only costs a re-measurement next time
    out << j.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

// Thread-count switch for the duration of a measurement.
struct ThreadsScope {
  int saved;
  explicit ThreadsScope(int n) : saved(threads()) { set_threads(n); }
  ~ThreadsScope() { set_threads(saved); }
};

}  // namespace

std::string peak_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::string base;
  if (xdg && *xdg) {
    base = xdg;
  } else {
    const char* home = std::getenv("HOME");
    base = std::string(home && *home ? home : "/tmp") + "/.cache";
  }
  return base + "/meshtrain/peak.json";
}

double time_gemm_flops(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       int reps, double* best_time_s) {
  // Small random-ish values; contents do not change the speed of a dense GEMM.
  const int64_t a_elems = M * K, b_elems = K * N;
  std::vector<float> C(static_cast<size_t>(M * N), 0.0f);
  std::vector<float> Af, Bf;
  std::vector<bf16> Ah, Bh;
  if (dtype == DType::kF32) {
    Af.resize(a_elems);
    Bf.resize(b_elems);
    for (int64_t i = 0; i < a_elems; ++i) Af[i] = static_cast<float>(i % 7) * 0.01f;
    for (int64_t i = 0; i < b_elems; ++i) Bf[i] = static_cast<float>(i % 5) * 0.01f;
  } else {
    Ah.resize(a_elems);
    Bh.resize(b_elems);
    for (int64_t i = 0; i < a_elems; ++i) Ah[i] = f32_to_bf16(static_cast<float>(i % 7) * 0.01f);
    for (int64_t i = 0; i < b_elems; ++i) Bh[i] = f32_to_bf16(static_cast<float>(i % 5) * 0.01f);
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  auto once = [&] {
    if (dtype == DType::kF32)
      gemm(trans_a, trans_b, M, N, K, 1.0f, Af.data(), lda, Bf.data(), ldb, 0.0f, C.data(), N);
    else
      gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, Ah.data(), lda, Bh.data(), ldb, 0.0f, C.data(), N);
  };
  once();  // warm-up: builds the primitive, faults in the pages
  double best = 1e30;
  for (int r = 0; r < std::max(1, reps); ++r) {
    const double t0 = now_s();
    once();
    best = std::min(best, now_s() - t0);
  }
  if (best_time_s) *best_time_s = best;
  return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / best;
}

double measure_peak_flops(DType dtype, int threads_n) {
  if (threads_n < 1) fail("peak_flops: threads must be >= 1, got {}", threads_n);
  ThreadsScope scope(threads_n);
  // GPT-2-shaped and square GEMMs; the peak is the best of them.
  struct Shape {
    int64_t M, N, K;
  };
  // 2048^3 matters at 2+ threads: the 1024-row shapes leave each thread too little work and
  // measured ~20% under it here (248 vs 310 GFLOP/s), which would inflate MFU.
  const Shape shapes[] = {
      {1024, 1024, 1024}, {1024, 3072, 768}, {1024, 768, 3072}, {2048, 2048, 2048}};
  double best = 0;
  for (const auto& s : shapes)
    for (bool trans_b : {false, true})
      best = std::max(best, time_gemm_flops(dtype, false, trans_b, s.M, s.N, s.K, 4));
  return best;
}

double store_peak_flops(DType dtype, int threads_n, double flops) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto j = read_cache();
  const std::string d(dtype_name(dtype)), t = std::to_string(threads_n);
  // A peak is the best rate seen: a measurement taken while the host was busy (two cores
  // shared with compilers and tests) must not lower it, or MFU would be inflated.
  if (j.contains(d) && j[d].is_object() && j[d].contains(t) && j[d][t].is_number())
    flops = std::max(flops, j[d][t].get<double>());
  g_known[{dtype, threads_n}] = flops;
  j[d][t] = flops;
  write_cache(j);
  return flops;
}

double peak_flops(DType dtype, int threads_n) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_known.find({dtype, threads_n});
    if (it != g_known.end()) return it->second;
    auto j = read_cache();
    const std::string d(dtype_name(dtype)), t = std::to_string(threads_n);
    if (j.contains(d) && j[d].is_object() && j[d].contains(t) && j[d][t].is_number()) {
      const double v = j[d][t].get<double>();
      if (v > 0) return g_known[{dtype, threads_n}] = v;
    }
  }
  const double v = measure_peak_flops(dtype, threads_n);
  store_peak_flops(dtype, threads_n, v);
  return v;
}

double gpu_peak_flops(DType dtype) {
#if MESHTRAIN_CUDA
  static std::mutex mu;
  static std::map<std::pair<int, int>, double> known;  // (GPU, dtype) -> FLOP/s
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{device::current_index(), static_cast<int>(dtype)};
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known[key] = cuda::time_gemm_flops(8192, dtype == DType::kBF16, 10);
#else
  fail("gpu_peak_flops: this meshtrain was built without CUDA (dtype {})", dtype_name(dtype));
#endif
}

}  // namespace mt::kernels
