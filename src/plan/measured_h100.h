// Kernel costs measured on a lent H100 80GB HBM3 (SXM5), generated into measured_h100.cpp by
// scripts/measured_tables.py from bench/results/gpu/h100-calibrate: the GEMM efficiency by
// shape and the fused attention PyTorch reaches (cuBLAS, cuDNN/flash through SDPA: what
// Megatron-style runs call), elementwise bandwidth, and meshtrain's measured launch floor.
#pragma once

#include "plan/hardware.h"

namespace mt::plan {

GemmTable h100_measured_gemm_table();
AttentionRates h100_measured_attention();
double h100_measured_hbm_efficiency();
double h100_measured_launch_s();
double h100_measured_compute_sustain();  // sustained / burst GEMM rate at the power limit
const char* h100_measured_source();      // the device and the run folder

}  // namespace mt::plan
