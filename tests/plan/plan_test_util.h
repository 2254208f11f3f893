// Shared pieces of the planner tests: the model and host of bench/plan-vs-runtime.
#pragma once

#include "plan/planner.h"

namespace mt::plan::test {

// A host of two cores shared by the ranks (what `meshtrain calibrate` writes), with the
// all-reduce slowing as more rank threads share the cores.
inline ClusterSpec shared_host() {
  ClusterSpec c = cluster_preset("dgx-a100");
  c.name = "this-host";
  c.gpus_per_node = 1024;
  c.compute_units = 2;
  c.backend = "local";
  c.host_links = {{2, 1e-6, 8e9}, {4, 2e-6, 5e9}, {8, 4e-6, 2e9}};
  c.intra_latency_s = c.inter_latency_s = 1e-6;
  c.intra_bytes_per_s = c.inter_bytes_per_s = 8e9;
  return c;
}

// The runtime-comparison model (4 layers, d_model 256, 4 heads, seq 128, batch 16, f32) on
// `gpus` ranks of the shared host.
inline Job runtime_tiny_job(int64_t gpus) {
  Job j;
  j.model = model_preset("tiny");
  j.model.n_layer = 4;
  j.model.d_model = 256;
  j.model.n_head = 4;
  j.model.d_ff = 1024;
  j.model.seq = 128;
  j.seq = 128;
  j.batch = 16;
  j.dtype = "f32";
  j.gpus = gpus;
  j.cluster = shared_host();
  return j;
}

}  // namespace mt::plan::test
