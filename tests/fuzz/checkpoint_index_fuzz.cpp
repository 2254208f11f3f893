// The checkpoint index reader (train/checkpoint.h read_index: DIR/index.json) and what the
// offline commands do with what it says: `inspect` (verify: every piece read and checked),
// `reshard` (check_resumable, load_global), `export` (the model built, load_targets). The
// checkpoint's shard files are fixed (a small tp 2 checkpoint written once per process by
// write_resharded); the input is its index.json.
#include "fuzz.h"
#include "model/gpt.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace mt;
namespace ckpt = mt::train::ckpt;

namespace {

// The model of the seed corpus (tests/fuzz/corpus/checkpoint_index/valid-tp2.json is the
// index.json written here): change one, remake the other (docs/fuzzing.md).
model::GptConfig seed_model() {
  model::GptConfig c;
  c.name = "fuzz";
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 4;
  c.d_ff = 8;
  c.vocab = 5;
  c.seq_len = 4;
  c.bias = false;  // fewer tensors: a smaller seed
  return c;
}

// The checkpoint directory, made once: step-00000001 of dp 1 tp 2 pp 1 zero 0.
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    ckpt::Index idx;
    idx.dir = "(the fuzz seed)";
    idx.config = seed_model();
    idx.step = 1;
    idx.batch = 2;
    idx.json_text = R"({"trainer": {"adam_steps": 1, "seed": 7, "batch": 2}})";
    ckpt::GlobalState st;
    st.specs = model::gpt_param_specs(idx.config);
    for (int k = 0; k < ckpt::kArrays; ++k)
      for (const model::ParamSpec& s : st.specs) {
        std::vector<float> v(static_cast<size_t>(shape_numel(s.shape)));
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(k) + 0.25f * i;
        st.arrays[k].push_back(std::move(v));
      }
    train::TrainOptions o;
    o.model = idx.config;
    o.batch = 2;
    o.tp = 2;
    const std::string out = (fuzz::scratch_dir() / "checkpoint").string();
    ckpt::write_resharded(idx, st, o, out);
    const std::string step = out + "/step-00000001";
    // tests/fuzz/make_seeds.py derives the corpus from this index (docs/fuzzing.md).
    if (const char* seed = std::getenv("MESHTRAIN_FUZZ_SEED_OUT"))
      std::filesystem::copy_file(step + "/index.json", seed,
                                 std::filesystem::copy_options::overwrite_existing);
    return step;
  }();
  return dir;
}

}  // namespace

MT_FUZZ_TARGET(checkpoint_index) {
  const std::string& dir = checkpoint_dir();
  fuzz::write_file(dir + "/index.json", bytes);
  ckpt::Index idx;
  if (!fuzz::read_or_refuse(dir, [&] { idx = ckpt::read_index(dir); })) return;
  // inspect
  fuzz::read_or_refuse(dir, [&] { (void)ckpt::verify(idx); });
  // reshard (into the checkpoint's own layout, as with no layout flags)
  fuzz::read_or_refuse(dir, [&] {
    train::TrainOptions o;
    o.model = idx.config;
    o.dp = idx.dp;
    o.tp = idx.tp;
    o.zero = idx.zero;
    o.pipeline.pp = idx.pp;
    ckpt::check_resumable(idx, o);
  });
  fuzz::read_or_refuse(dir, [&] { (void)ckpt::load_global(idx); });
  // export: the whole model (tp 1) with its master weights (cli/checkpoint.cpp model_of)
  fuzz::read_or_refuse(dir, [&] {
    model::Gpt gpt(idx.config, idx.seed);
    std::vector<ckpt::Target> targets;
    for (model::Param& p : gpt.params().params()) {
      ckpt::Target t;
      t.spec = &p.spec;
      t.hi = p.value.numel();
      t.dst[0] = p.value.f32();
      targets.push_back(t);
    }
    ckpt::load_targets(idx, targets);
  });
}
