// The mixture-of-experts layer (docs/moe.md): in an MoE block it takes the MLP's place,
// between ln_2 and the residual. A router (linear, no bias) scores E experts per token, the
// top k are chosen (model/moe_routing.h), the tokens are sorted by expert and each expert's
// rows run as one GEMM (its MLP: SwiGLU or GELU), and the outputs are combined with the
// gates; a shared expert, when the config has one, runs on every token beside them. An
// explicit forward/backward pair like every layer; routing is held fixed in backward (top-k
// is not differentiable: the gradient reaches the router through the gates and the
// balancing losses).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/moe_routing.h"
#include "model/params.h"
#include "model/routing_tape.h"
#include "parallel/context.h"
#include "parallel/expert.h"

namespace mt::model {

struct MixedPrecision;
struct Linear;

// What training sets for every MoE layer (not the model's shape): the capacity and the
// balancing losses' coefficients (--moe-capacity-factor, --moe-aux-loss, --moe-z-loss).
struct MoeOptions {
  double capacity_factor = 0;  // 0: dropless
  double aux_loss = 0;         // α of Switch's α·E·Σ fᵢ·Pᵢ
  double z_loss = 0;           // β of ST-MoE's β·mean(lse²)
  // DeepSeek-V3's auxiliary-loss-free balancing (--moe-balance bias): a per-expert bias
  // added to the router probabilities for choosing the experts only, moved after every step
  // by bias_rate towards balance (+rate for an expert below the mean load, -rate above).
  bool balance_bias = false;
  double bias_rate = 1e-3;  // γ (DeepSeek-V3: 0.001)
  // --moe-shadow: with ep, the experts of an overloaded rank are shadowed (their weights sent
  // to every ep rank, the rows computed where they are; parallel/expert.h) while the
  // heaviest rank's rows exceed shadow_above x the mean (--moe-shadow-above).
  bool shadow = false;
  double shadow_above = 1.1;
};

// One MoE layer's counters, summed over the microbatches whose backward ran since the last
// reset (the trainer's per-step report): tokens routed to each expert, assignments dropped
// by the capacity, and the balancing losses (before their coefficients) summed over
// microbatches.
struct MoeStats {
  std::vector<double> routed;  // [E]
  double assignments = 0, dropped = 0;
  double aux = 0, z = 0;  // sums of BalanceLosses over microbatches
  double microbatches = 0;
  double shadowed = 0;  // experts shadowed (--moe-shadow), summed over microbatches
  void reset(int64_t experts) {
    routed.assign(static_cast<size_t>(experts), 0.0);
    assignments = dropped = aux = z = microbatches = shadowed = 0;
  }
};

// What an MoE layer keeps for backward (one microbatch of n tokens; rows of the expert
// buffers: up to n·k, the kept assignments in expert order).
//
// With expert parallelism (ep ranks) the expert buffers h, act and xe hold the rows this
// rank's E/ep experts received from every ep rank (at most R = ep·n·min(k, E/ep), expert-
// major), and ys the outputs of this rank's own kept rows, returned by the combine.
struct MoeActivations {
  Tensor probs, lse, gate;              // [n, E], [n], [n, k]
  Tensor expert, slot, order;           // i32: [n, k], [n, k], [n·k]
  Tensor h;                             // [rows, FC] the experts' first projection (gate | up)
  Tensor act;                           // [rows, F] its activation
  Tensor ys;                            // [n·k, C] the experts' outputs, before the gates
  Tensor xe;                            // ep: [R, C] the received rows (the experts' inputs)
  Tensor shared_h, shared_act;          // the shared expert's: [n, FCs], [n, Fs]
  std::vector<int64_t> counts, routed;  // [E]
  int64_t kept = 0;
  parallel::ep::Exchange exchange;  // ep: who sent how many rows to which local expert
  BalanceLosses losses;
  RoutingReplay replay;  // set by the model before each forward (verify's routing replay)
  BalanceSums whole;     // cp: the balancing sums of the whole microbatch (all cp pieces)
  // cp with a capacity: this rank's chosen experts and the drops decided on the whole
  // microbatch's gathered choices (cp_capacity), routed with as given.
  std::vector<int32_t> cp_expert;
  std::vector<uint8_t> cp_dropped;
  // --moe-shadow (parallel/expert.h): which experts this microbatch shadowed ([E], empty:
  // none), their weights gathered from their owners (the GEMM's dtype, expert order: the
  // matrices, then the f32 biases), and this rank's rows of them through their MLP (kept for
  // backward; allocated on the first shadow).
  std::vector<uint8_t> shadowed;
  int64_t shadows = 0;
  Tensor shadow_w, shadow_b;  // [E/ep, FC·C + C·F], [E/ep, FC + C] (with biases)
  // Where this rank's shadowed rows' h and act are: from row shadow_row0 of h and act (after
  // the received rows), or -1: in shadow_h and shadow_act ([n·k, FC], [n·k, F]; only where
  // they do not fit, top_k > E/ep).
  int64_t shadow_row0 = -1;
  Tensor shadow_h, shadow_act;
};

// Scratch shared by the MoE layers of a rank.
struct MoeScratch {
  Tensor logits;  // [n, E] the router's output; d(logits) in backward
  Tensor xs;      // [n·k, C] the tokens gathered in expert order (and their gradient)
  Tensor dys;     // [n·k, C]
  Tensor dact;    // [n·k, F]
  Tensor dh;      // [n·k, FC]
  Tensor dgate;   // [n, k]
  Tensor y;       // [n, C] the layer's output, and the shared expert's / router's dx
  Tensor dshared_act, dshared_h;  // [n, Fs], [n, FCs]
  // ep: [R, C] rows in source-major order (what the all-to-alls move), and [R, C] the
  // experts' outputs (expert-major), then their output and input gradients.
  Tensor xr, ye;
  // --moe-shadow: this rank's own shadowed weights packed to send, and the shadowed experts'
  // weight gradients (this rank's rows') and their sums at the owner (allocated on use).
  Tensor shadow_pack, shadow_pack_b, shadow_dw, shadow_sum;
};

struct MoeLayer {
  Param* router = nullptr;     // [E, C]
  Param* w_in = nullptr;       // [E, FC, C]: each expert's c_fc (SwiGLU: gate | up)
  Param* b_in = nullptr;       // [E, FC] or null
  Param* w_out = nullptr;      // [E, C, F]: each expert's c_proj
  Param* b_out = nullptr;      // [E, C] or null
  Param* shared_in = nullptr;  // [FCs, C], null without a shared expert
  Param* shared_in_b = nullptr;
  Param* shared_out = nullptr;  // [C, Fs]
  Param* shared_out_b = nullptr;
  int64_t experts = 0, top_k = 0, c = 0, f = 0, f_shared = 0;
  MlpKind mlp = MlpKind::kSwiGlu;
  RouterOrder order = RouterOrder::kSoftmaxTopK;
  const MixedPrecision* mp = nullptr;  // bf16 expert GEMMs (the router's stays f32)
  const MoeOptions* options = nullptr;
  const float* selection_bias = nullptr;  // [E] --moe-balance bias; null: none
  MoeStats* stats = nullptr;              // added to in backward; null: none

  int64_t fc() const { return mlp == MlpKind::kSwiGlu ? 2 * f : f; }
  int64_t fc_shared() const { return mlp == MlpKind::kSwiGlu ? 2 * f_shared : f_shared; }

  parallel::ep::EpContext ep;  // --ep: this rank holds experts [ep.rank·E/ep, +E/ep)
  // --cp: the model's context parallelism (null or size 1: none). A cp rank routes its piece
  // of every sequence; the balancing losses are the whole microbatch's (sums over cp).
  const parallel::cp::CpContext* cp = nullptr;

  int64_t local_experts() const { return experts / ep.size; }
  // ep: the number of ranks the experts are split over (1: all here).
  static MoeActivations make_activations(const GptConfig& c, int64_t n, int ep = 1);
  static MoeScratch make_scratch(const GptConfig& c, int64_t n, int ep = 1);
  // --moe-shadow: a microbatch's buffers for shadowed experts (their weights, kept for
  // backward; h and act where they do not fit after the received rows), made with the rest of
  // its activations (Gpt::make_activations): a buffer that a pipeline schedule first uses in a
  // later step must not allocate then.
  void make_shadow_activations(MoeActivations& a) const;

  // y [n, C] = the layer's output for x [n, C] (overwritten).
  void forward(MoeActivations& a, float* y, const float* x, int64_t n, MoeScratch& s) const;
  // cp with a capacity: gathers every cp rank's choices (r routed dropless) and decides the
  // whole microbatch's drops as the single rank would (a.cp_expert, a.cp_dropped).
  void cp_capacity(MoeActivations& a, const Routing& r, double capacity_factor, int64_t n) const;
  // dx [n, C] overwritten with d(loss)/dx for dy = d(loss)/dy; parameter gradients added.
  // loss_weight: d(loss)/d(this microbatch's mean balancing losses), the trainer's dloss
  // times the microbatch's tokens, so that the losses enter as token-weighted means.
  void backward(float* dx, const float* dy, const float* x, int64_t n, const MoeActivations& a,
                MoeScratch& s, float loss_weight) const;

 private:
  Routing routing(const MoeActivations& a, int64_t n) const;
  // Each local expert's rows (rows_of[e], consecutive from row 0) through its MLP: x -> y,
  // keeping h and act. Backward: dy_dx holds d(y) in and d(x) out (row for row); the weight
  // gradients are added.
  void experts_forward(const std::vector<int64_t>& rows_of, const float* x, float* h, float* act,
                       float* y) const;
  void experts_backward(const std::vector<int64_t>& rows_of, float* dy_dx, const float* x,
                        const float* h, const float* act, MoeScratch& s) const;
  void mlp_forward(float* h, float* act, float* y, const float* x, int64_t rows, const float* w1,
                   const bf16* w1b, const float* b1, const float* w2, const bf16* w2b,
                   const float* b2, int64_t width) const;
  // One expert's rows back through its MLP: dy_dx holds d(y) in and d(x) out; dw1, db1, dw2,
  // db2 added to (a bias gradient may be null).
  void mlp_backward(float* dy_dx, const float* x, const float* h, const float* act, int64_t rows,
                    const float* w1, const bf16* w1b, float* dw1, float* db1, const float* w2,
                    const bf16* w2b, float* dw2, float* db2, MoeScratch& s) const;
  // --moe-shadow: gathers the shadowed experts' weights from their owners and runs this
  // rank's rows of them (xs, expert-sorted) into a.ys; backward: their gradients through
  // those rows (dys in place, x the layer's input), summed at the owners.
  int64_t shadow_matrix_elems() const { return fc() * c + c * f; }
  int64_t shadow_bias_elems() const { return (b_in ? fc() : 0) + (b_out ? c : 0); }
  void shadow_buffers(MoeActivations& a, MoeScratch& s) const;
  void shadow_forward(MoeActivations& a, const float* xs, MoeScratch& s) const;
  void shadow_backward(const MoeActivations& a, float* dys, const float* x, const Routing& r,
                       MoeScratch& s) const;
};

}  // namespace mt::model
