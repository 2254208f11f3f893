// Hardware specs of the planner: a GPU (peak dense FLOP/s by dtype, HBM, the calibrated GEMM
// efficiency curve), a node (GPUs and their intra-node link) and a cluster (nodes and the
// inter-node link per GPU). Presets are embedded (dgx-a100, dgx-h100, hgx-b200); `this-host`
// is written by `meshtrain calibrate`; any other name is read as a JSON file.
#pragma once

#include <cstdint>
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

struct GpuSpec {
  std::string name;
  double peak_flops_bf16 = 0;  // dense tensor-core FLOP/s (also fp16)
  double peak_flops_f32 = 0;
  double hbm_bytes = 0;
  double hbm_bytes_per_s = 0;
  double hbm_efficiency = 0.7;  // achieved fraction of HBM bandwidth by elementwise kernels
  GemmCurve gemm;
  double kernel_overhead_s = 0;  // fixed time per layer pass (launches, small kernels)
  double peak_flops(const std::string& dtype) const;
};

// A collective link measured on a shared host with `ranks` rank threads (or processes)
// running at once: more ranks than cores makes every ring step wait for the scheduler.
struct HostLink {
  int ranks = 2;
  double latency_s = 0, bytes_per_s = 0;  // α and bus bandwidth of the all-reduce
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
  int compute_units = 0;  // this-host: cores shared by all ranks (0: a GPU each)
  // this-host: the backend whose all-reduce the links were timed with ("local", "mpi"); the
  // memory model counts that backend's scratch. Empty for GPU clusters.
  std::string backend;
  // this-host: the all-reduce's α and bus bandwidth by the job's rank count (ascending).
  std::vector<HostLink> host_links;
  // The cluster as a job of `ranks` ranks sees it: with host_links, the links are those
  // measured at that rank count (linear between measured counts, the nearest beyond them);
  // on a shared host (compute_units > 0) each rank's memory is 1/ranks of the host's.
  ClusterSpec for_job(int64_t ranks) const;
};

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
