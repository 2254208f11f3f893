// Hardware specs of the planner: a GPU (peak dense FLOP/s by dtype, HBM, the calibrated GEMM
// efficiency curve), a node (GPUs and their intra-node link) and a cluster (nodes and the
// inter-node link per GPU). Presets are embedded (dgx-a100, dgx-h100, hgx-b200); `this-host`
// is written by `meshtrain calibrate`; any other name is read as a JSON file.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::plan {

// Achieved GEMM rate as a function of shape: rate = peak * eff_max / ((1 + d0/m)(1 + d0/n)
// (1 + d0/k)). One curve per GPU type (eff_max, d0), fitted once; see docs/planner.md.
struct GemmCurve {
  double eff_max = 0.75;  // fraction of peak reached by a large square GEMM
  double d0 = 48;         // dimension at which one side halves the rate
  double efficiency(double m, double n, double k) const {
    return eff_max / ((1 + d0 / m) * (1 + d0 / n) * (1 + d0 / k));
  }
};

// Achieved GEMM efficiency (rate / the dtype's peak) measured on a grid of shapes: `meshtrain
// calibrate --device cuda` times C[M, N] = A[M, K] B[N, K]^T at every (m, n, k) of the grid.
// Where a table is given it replaces the curve for its dtype (docs/planner.md, "Kernel
// costs").
struct GemmTable {
  std::string dtype = "bf16";      // the operands' type it was measured in (bf16: mixed runs)
  std::vector<double> m, n, k;     // ascending grid points of each dimension
  std::vector<double> efficiency;  // [m.size()][n.size()][k.size()], row-major
  bool empty() const { return efficiency.empty(); }
  // Trilinear in log2 of each dimension between grid points. Above the largest point the
  // efficiency is held; below the smallest the GEMM takes the smallest one's time (a kernel
  // that small is bound by its launch and tail), so the efficiency falls in proportion.
  double at(double M, double N, double K) const;
};

// The curve closest to measured points {m, n, k, efficiency}: a grid search over eff_max and
// d0 minimising the squared log error (calibrate's fit, on a CPU or a GPU's table).
GemmCurve fit_gemm_curve(const std::vector<std::array<double, 4>>& points);

// A fused (flash) attention kernel's achieved rate by sequence length, forward and backward,
// at one head dimension, as a published kernel benchmark or `calibrate` (a GPU's fused kernel,
// or on a CPU host our blockwise kernel by call length) measured it. FLOP/s are counted as
// those benchmarks count them: 4·s²·d per head forward for the full T×T, half of it under a
// causal mask; backward 2.5× the forward FLOPs. Empty: the GEMM curve on the full T×T
// (docs/planner.md, "Kernel costs").
struct AttentionRates {
  int head_dim = 128;
  std::vector<double> seq;              // ascending
  std::vector<double> fwd_flops_per_s;  // causal, forward
  std::vector<double> bwd_flops_per_s;  // backward
  bool empty() const { return seq.empty(); }
  // The rate at sequence length s, piecewise linear in log2(s), held beyond the ends.
  static double at(const std::vector<double>& seq, const std::vector<double>& rate, double s);
};

struct GpuSpec {
  std::string name;
  double peak_flops_bf16 = 0;  // dense tensor-core FLOP/s (also fp16)
  double peak_flops_f32 = 0;
  double hbm_bytes = 0;
  double hbm_bytes_per_s = 0;
  double hbm_efficiency = 0.7;  // achieved fraction of HBM bandwidth by elementwise kernels
  GemmCurve gemm;
  GemmTable gemm_table;          // measured by shape; empty: the curve
  double kernel_overhead_s = 0;  // fixed time per layer pass (launches, small kernels)
  // The least time any kernel takes (its launch and tail): a GEMM or memory-bound kernel
  // shorter than this costs this. 0: none.
  double kernel_launch_s = 0;
  AttentionRates attention;  // fused attention; empty: the GEMM curve
  // The fraction of a measured burst rate (gemm_table, attention: timed in ~2 ms batches)
  // that compute-bound kernels keep under sustained load, where the clock falls to what the
  // power limit allows (an H100 SXM at 700 W: 0.874, bench/gpu/sustained_gemm.py). Applies
  // to the table and the attention rates, not to the curve (fitted or estimated as sustained).
  double compute_sustain = 1.0;
  // Where each number comes from, by field (gemm, hbm_efficiency, attention,
  // kernel_launch_s): a measurement, a published table, or an estimate.
  std::map<std::string, std::string> sources;
  double peak_flops(const std::string& dtype) const;
  // The GEMM efficiency of an [M, K] x [K, N] product in `dtype`: the measured table where it
  // covers the dtype (a bf16 table covers the mixed-precision dtypes), else the curve.
  double gemm_efficiency(double M, double N, double K, const std::string& dtype) const;
};

// A collective link measured on a shared host with `ranks` rank threads (or processes)
// running at once: more ranks than cores makes every ring step wait for the scheduler.
struct HostLink {
  int ranks = 2;
  double latency_s = 0, bytes_per_s = 0;  // α and bus bandwidth of the all-reduce
};

// The all-reduce's time by message size over the link between nodes, `ranks` ranks (one per
// node) in every group at once, as `calibrate` times it across hosts: TCP is slower on
// mid-size messages than α and the bandwidth of small and large ones give (a rendezvous
// round trip above Open MPI's eager limit, the window's growth), so the planner reads the
// time at the size instead (plan/planner.cpp, hier_collective).
struct LinkCurve {
  int ranks = 0;                // 0: none measured
  std::vector<double> bytes;    // message size per rank, ascending
  std::vector<double> seconds;  // the all-reduce's median time at that size
  bool empty() const { return ranks < 2 || bytes.empty(); }
  // The time at `b` bytes: log-log linear between the measured sizes, the smallest's time
  // below them, proportional to the size above them (bandwidth-bound).
  double at(double b) const;
};

struct ClusterSpec {
  std::string name;
  GpuSpec gpu;
  int gpus_per_node = 8;
  int64_t max_nodes = 0;         // 0: unlimited
  double intra_bytes_per_s = 0;  // per GPU, one direction (NVLink/NVSwitch)
  double intra_latency_s = 0;
  double inter_bytes_per_s = 0;  // per GPU, one direction (its InfiniBand rail)
  double inter_latency_s = 0;
  // The link between sites (training across sites, plan/sites.h): bytes/s each way per
  // site and seconds per message; 0: none given (plan --sites then needs --site-gbps).
  double site_bytes_per_s = 0;
  double site_latency_s = 0;
  int compute_units = 0;  // this-host: cores shared by all ranks (0: a GPU each)
  // this-host: the backend whose all-reduce the links were timed with ("local", "mpi"); the
  // memory model counts that backend's scratch. Empty for GPU clusters.
  std::string backend;
  // this-host: the all-reduce's α and bus bandwidth by the job's rank count (ascending).
  std::vector<HostLink> host_links;
  // Hosts calibrated under mpirun: the inter-node all-reduce by size (empty: α-β only).
  LinkCurve inter_curve;
  // The cluster as a job of `ranks` ranks sees it: with host_links, the links are those
  // measured at that rank count (linear between measured counts, the nearest beyond them);
  // on a shared host (compute_units > 0) each rank's memory is 1/ranks of the host's.
  ClusterSpec for_job(int64_t ranks) const;
};

// cuDNN's fused attention on an H100 SXM5 in BF16 at head dim 128, as the FlashAttention-3
// paper (Shah et al. 2024, Figures 5-6) measured it. Not in the dgx-h100 preset by default:
// docs/planner.md, "Kernel costs", says why.
AttentionRates h100_cudnn_attention();

ClusterSpec cluster_preset(const std::string& name);  // preset name or JSON file path
std::vector<std::string> cluster_preset_names();
nlohmann::json to_json(const ClusterSpec& c);
// Reads to_json's format and validates it.
ClusterSpec cluster_from_json(const nlohmann::json& j);
// Refuses a spec whose numbers the model cannot use (a rate or size <= 0, a negative
// latency, an efficiency above 1), naming the field and the fix.
void validate(const ClusterSpec& c);
// Where `meshtrain calibrate` writes the this-host preset.
std::string this_host_path();

}  // namespace mt::plan
