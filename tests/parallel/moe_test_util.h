// The MoE tests' model (moe_equiv_test, moe_mpi_test): the 3D tests' Llama with every MLP
// 4 routed SwiGLU experts, top 2, the Switch balancing loss on, microbatches of 2 sequences.
#pragma once

#include "parallel3d_test_util.h"

namespace mt::test {

struct Moe {
  double capacity = 0;  // 0: dropless
  bool bias = false;    // --moe-balance bias (rate 0.01: visible within the tests' steps)
  bool shadow = false;  // --moe-shadow at any imbalance (--moe-shadow-above 1), with ep only
};

inline train::TrainOptions moe_options(const Layout3d& l, int64_t steps, const char* dtype,
                                       const Moe& m) {
  train::TrainOptions o = options3d(l, steps);
  make_llama3d(o.model);
  o.model.name = "mixtral-3d";
  o.model.d_ff = 88;
  o.model.moe.n_experts = 4;
  o.model.moe.top_k = 2;
  o.moe.aux_loss = 0.01;
  o.moe.capacity_factor = m.capacity;
  o.moe.balance_bias = m.bias;
  o.moe.bias_rate = 0.01;
  o.moe.shadow = m.shadow && l.ep > 1;  // the oracle runs the same model without ep
  o.moe.shadow_above = 1.0;
  o.dtype = dtype;
  // The balancing loss and the capacity are per microbatch (as in Megatron-LM): every
  // layout and the oracle run microbatches of the same 2 sequences.
  o.microbatch = 2;
  if (l.pp > 1) o.pipeline.microbatches = static_cast<int>(o.batch / l.dp / o.microbatch);
  return o;
}

}  // namespace mt::test
