// Training on a GPU (--device cuda) against the CPU: the refusals run everywhere; the
// training tests need a CUDA GPU and skip themselves, saying so, where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "test_util.h"
#include "tiny_run.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

class CudaTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new std::string(test::demo_tokens(test::scratch_dir("cuda_train")));
  }
  static TrainOptions tiny(int64_t steps, const std::string& device) {
    TrainOptions o = test::tiny_run(*data_, steps, 64, 8);
    o.device = device;
    o.keep_final_params = true;
    return o;
  }
  static bool have_gpu() { return device::cuda_device_count() > 0; }
  static std::string* data_;
};
std::string* CudaTrain::data_ = nullptr;

#define MT_NEED_GPU()                                                                    \
  do {                                                                                   \
    if (!have_gpu())                                                                     \
      GTEST_SKIP() << "no CUDA GPU on this machine (or a build without CUDA): --device " \
                      "cuda training is compiled but not run here";                      \
  } while (0)

TEST_F(CudaTrain, RefusesWhatAGpuCannotDoYet) {
  TrainOptions o = tiny(2, "cuda");
  o.tp = 2;
  o.export_path = (test::scratch_dir("cuda_train_export") / "m.safetensors").string();
  try {
    run_training(o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    // Without a CUDA build the first refusal is that one; with it, the tp export's.
    const std::string m = e.what();
    EXPECT_TRUE(m.find("--export of a tp > 1 or pp > 1 layout") != std::string::npos ||
                m.find("built without CUDA") != std::string::npos)
        << m;
    EXPECT_EQ(e.exit_code(), 2);
  }
  o = tiny(2, "tpu");
  EXPECT_THROW(run_training(o), Error);
  o = tiny(2, "cpu");
  o.backend = "nccl";
  try {
    run_training(o);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add --device cuda"), std::string::npos) << e.what();
  }
}

// --attention: what auto resolves to, and the refusals of what cannot run (no GPU needed).
TEST_F(CudaTrain, AttentionChoice) {
  const auto refusal = [](TrainOptions o) -> std::string {
    try {
      o.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      return e.what();
    }
    return "";
  };
  TrainOptions o = tiny(2, "cpu");  // tiny: head dim 32
  o.attention = "blockwise";
  EXPECT_NE(refusal(o).find("--attention 'blockwise' is not an attention kernel"),
            std::string::npos);
  // flash (also named fused) is the device's flash-style kernel: on the CPU the blockwise
  // f32 kernel, in any --dtype.
  for (const char* name : {"flash", "fused"}) {
    o.attention = name;
    EXPECT_EQ(refusal(o), "");
    EXPECT_TRUE(o.fused_attention());
  }
  o.device = "cuda";
  EXPECT_NE(refusal(o).find("add --dtype bf16"), std::string::npos);
  o.dtype = "bf16";
  o.model.n_head = 8;  // head dim 16
  EXPECT_NE(refusal(o).find("--attention fused: "), std::string::npos);

  // auto: fused exactly on a GPU, in bf16, with a head dim the kernel has.
  TrainOptions a = tiny(2, "cuda");
  a.dtype = "bf16";
#if MESHTRAIN_CUDA
  EXPECT_TRUE(a.fused_attention());
  EXPECT_EQ(refusal([&] {
              TrainOptions f = a;
              f.attention = "fused";
              return f;
            }()),
            "");
#else
  EXPECT_FALSE(a.fused_attention());  // the build has no fused kernel
#endif
  TrainOptions b = a;
  b.attention = "naive";
  EXPECT_FALSE(b.fused_attention());
  b = a;
  b.dtype = "f32";
  EXPECT_FALSE(b.fused_attention());
  b = a;
  b.device = "cpu";  // the CPU's auto: by sequence length (seq 64 here)
  EXPECT_EQ(b.fused_attention(), cpu_flash_by_default(64));
  b = a;
  b.model.n_head = 8;
  EXPECT_FALSE(b.fused_attention());
  b.model.n_head = 2;  // head dim 64
  EXPECT_EQ(b.fused_attention(), kernels::fused_attention_unsupported(64, 64).empty());
}

// The choice is the calling thread's: verify's CPU oracle and its GPU layout run in one
// process, each rank thread with the buffers its own choice sized.
TEST_F(CudaTrain, FusedAttentionIsPerThread) {
#if MESHTRAIN_CUDA
  kernels::set_fused_attention(true);
  bool other = true;
  std::thread([&] { other = kernels::fused_attention(); }).join();
  EXPECT_TRUE(kernels::fused_attention());
  EXPECT_FALSE(other);
  kernels::set_fused_attention(false);
  EXPECT_FALSE(kernels::fused_attention());
#else
  // Without CUDA the switch is the CPU's blockwise kernel, per thread all the same.
  kernels::set_fused_attention(true);
  bool other = true;
  std::thread([&] { other = kernels::fused_attention(); }).join();
  EXPECT_TRUE(kernels::fused_attention());
  EXPECT_FALSE(other);
  kernels::set_fused_attention(false);
  EXPECT_FALSE(kernels::fused_attention());
#endif
}

TEST_F(CudaTrain, NoGpuIsAClearError) {
  if (have_gpu()) GTEST_SKIP() << "this machine has a GPU";
  try {
    run_training(tiny(2, "cuda"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("no CUDA GPU is visible") != std::string::npos ||
                m.find("built without CUDA") != std::string::npos)
        << m;
  }
}

// The f32 comparison of F32LossesMatchTheCpu and LlamaF32LossesMatchTheCpu (tolerances
// explained above the first): every step's loss and grad norm, the final weights, and no
// allocation after the first step on the GPU.
void expect_f32_match(const TrainOptions& on_cpu, const TrainOptions& on_gpu) {
  const TrainResult cpu = run_training(on_cpu), gpu = run_training(on_gpu);
  ASSERT_EQ(cpu.steps.size(), gpu.steps.size());
  for (size_t i = 0; i < cpu.steps.size(); ++i) {
    EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 2e-5 * std::abs(cpu.steps[i].loss))
        << "step " << i + 1;
    EXPECT_NEAR(gpu.steps[i].grad_norm, cpu.steps[i].grad_norm, 1e-3 * cpu.steps[i].grad_norm)
        << "step " << i + 1;
  }
  ASSERT_EQ(cpu.final_params.size(), gpu.final_params.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.final_params.size(); ++i)
    worst = std::max(worst, std::abs(double(cpu.final_params[i]) - gpu.final_params[i]));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(gpu.allocations_after_first_step, 0);
}

// The same model, data and steps on the GPU and on the CPU: f32 everywhere, the GPU's GEMMs
// in true f32 (no TF32), so the losses agree to summation order. The tolerances are not yet
// measured on a GPU: they are 10x verify's former f32 defaults for the loss and grad norm (2e-6 and
// 1e-4, docs/verify.md, 10-20x the worst CPU layout) and verify's default for the weights
// (1e-4), since cuBLASLt's GEMMs sum in another order than oneDNN's in every dot product.
// Record the measured worst in docs/verify.md and tighten them.
TEST_F(CudaTrain, F32LossesMatchTheCpu) {
  MT_NEED_GPU();
  expect_f32_match(tiny(20, "cpu"), tiny(20, "cuda"));
}

// A Llama-family model (RMSNorm, RoPE, SwiGLU, 4 query heads sharing 2 kv heads: every kernel
// of kernels/cuda/llama.cu) on the GPU against the CPU, with F32LossesMatchTheCpu's tolerances
// and for the same reasons; not yet run on a GPU (cuda_llama_emulated_test checks the kernels'
// indexing in every build).
TEST_F(CudaTrain, LlamaF32LossesMatchTheCpu) {
  MT_NEED_GPU();
  TrainOptions c = tiny(20, "cpu"), g = tiny(20, "cuda");
  c.model = g.model = model::preset("llama-tiny");
  c.model.seq_len = g.model.seq_len = 64;
  expect_f32_match(c, g);
}

TEST_F(CudaTrain, Bf16LossesTrackTheCpu) {
  MT_NEED_GPU();
  TrainOptions c = tiny(20, "cpu"), g = tiny(20, "cuda");
  c.dtype = g.dtype = "bf16";
  const TrainResult cpu = run_training(c), gpu = run_training(g);
  ASSERT_EQ(cpu.steps.size(), gpu.steps.size());
  // 5x verify's bf16 loss default (1e-3, docs/verify.md: rounding the GEMM inputs to bf16
  // makes any f32 reordering visible from step 2 on); not yet measured on a GPU.
  for (size_t i = 0; i < cpu.steps.size(); ++i)
    EXPECT_NEAR(gpu.steps[i].loss, cpu.steps[i].loss, 5e-3 * std::abs(cpu.steps[i].loss))
        << "step " << i + 1;
}

TEST_F(CudaTrain, SameSeedIsBitwiseDeterministic) {
  MT_NEED_GPU();
  const TrainResult a = run_training(tiny(5, "cuda")), b = run_training(tiny(5, "cuda"));
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_EQ(a.final_params, b.final_params);
}

// Checkpoints on a GPU go through a host copy of the optimizer range: a run stopped after
// step 3 and resumed continues bitwise like the uninterrupted one.
TEST_F(CudaTrain, CheckpointResumeIsExact) {
  MT_NEED_GPU();
  const std::string dir = test::scratch_dir("cuda_train_ckpt").string();
  TrainOptions whole_o = tiny(6, "cuda");
  whole_o.checkpoint_dir = dir;
  whole_o.checkpoint_every = 3;
  whole_o.keep_checkpoints = 0;
  const TrainResult whole = run_training(whole_o);
  TrainOptions rest = tiny(6, "cuda");
  rest.checkpoint_dir = test::scratch_dir("cuda_train_ckpt_rest").string();
  rest.resume = dir + "/step-00000003";
  const TrainResult resumed = run_training(rest);
  ASSERT_EQ(resumed.start_step, 3);
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(resumed.steps[i].loss, whole.steps[i + 3].loss) << "step " << i + 4;
  EXPECT_EQ(resumed.final_params, whole.final_params);
}

// Several rank threads on the one GPU (the local backend stages device buffers through the
// host): the layouts still match the single rank on the same GPU, as CPU layouts match the
// CPU's (docs/verify.md): loss within 25x verify's former f32 loss default (2e-6), grad norm and final
// weights (dp layouts, whose rank 0 holds them all) within verify's defaults (1e-4 each,
// 10-20x the worst CPU layout over 20 steps; these runs are 6).
TEST_F(CudaTrain, LayoutsOnOneGpuMatchTheSingleRank) {
  MT_NEED_GPU();
  const TrainResult one = run_training(tiny(6, "cuda"));
  struct L {
    int dp, tp, pp, zero;
  };
  for (const L l : {L{2, 1, 1, 0}, L{2, 1, 1, 3}, L{1, 2, 1, 0}, L{1, 1, 2, 1}}) {
    TrainOptions o = tiny(6, "cuda");
    o.dp = l.dp;
    o.tp = l.tp;
    o.pipeline.pp = l.pp;
    o.zero = l.zero;
    o.keep_final_params = l.tp == 1 && l.pp == 1;
    const TrainResult r = run_training(o);
    const std::string what = "dp " + std::to_string(l.dp) + " tp " + std::to_string(l.tp) + " pp " +
                             std::to_string(l.pp) + " zero " + std::to_string(l.zero);
    ASSERT_EQ(r.steps.size(), one.steps.size()) << what;
    for (size_t i = 0; i < one.steps.size(); ++i) {
      EXPECT_NEAR(r.steps[i].loss, one.steps[i].loss, 5e-5 * std::abs(one.steps[i].loss))
          << what << " step " << i + 1;
      EXPECT_NEAR(r.steps[i].grad_norm, one.steps[i].grad_norm, 1e-4 * one.steps[i].grad_norm)
          << what << " step " << i + 1;
    }
    if (!o.keep_final_params) continue;
    ASSERT_EQ(r.final_params.size(), one.final_params.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < one.final_params.size(); ++i)
      worst = std::max(worst, std::abs(double(r.final_params[i]) - one.final_params[i]));
    EXPECT_LT(worst, 1e-4) << what;
  }
}

}  // namespace
}  // namespace mt::train
