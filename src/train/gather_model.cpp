#include "train/gather_model.h"

#include <algorithm>
#include <vector>

#include "core/device.h"
#include "train/pipeline_stage.h"

namespace mt::train {

// Tensor parallelism: the rank's (stage) model from the tp group's shards (an all-gather
// of each parameter over tp, every slice put back where for_each_tp_run says), as a
// tp = 1 Gpt of the same stage (the vocabulary padded to 128 again; the extra tp padding
// rows are dropped). Collective over `tp`; returns the model on tp rank 0, null elsewhere.
std::unique_ptr<model::Gpt> gather_tp_shards(const model::Gpt& gpt, comm::Group& tp,
                                             const model::GptConfig& config, uint64_t seed) {
  std::unique_ptr<model::Gpt> whole;
  if (tp.rank() == 0)
    whole = std::make_unique<model::Gpt>(config, seed, model::StoreOptions{},
                                         parallel::tp::TpContext{}, gpt.parts());
  const auto& mine = gpt.params().params();
  std::vector<float> gathered, global;
  for (size_t i = 0; i < mine.size(); ++i) {
    const model::ParamSpec& spec = mine[i].spec;
    const int64_t n = shape_numel(spec.shape);
    gathered.resize(static_cast<size_t>(n * tp.size()));
    tp.all_gather(comm::Buf(const_cast<float*>(mine[i].value.f32()), n),
                  comm::Buf(gathered.data(), n * tp.size()));
    if (!whole) continue;
    global.assign(static_cast<size_t>(shape_numel(spec.full_shape())), 0.f);
    for (int r = 0; r < tp.size(); ++r) {
      model::ParamSpec rs = spec;
      rs.tp_rank = r;
      model::for_each_tp_run(rs, [&](int64_t lf, int64_t gf, int64_t len) {
        std::copy_n(gathered.begin() + r * n + lf, len, global.begin() + gf);
      });
    }
    model::Param& dst = whole->params().params()[i];
    std::copy_n(global.begin(), dst.value.numel(), dst.value.f32());  // drops tp-only padding
  }
  return whole;
}

// Expert parallelism: the rank's (stage, tp-sharded) model with all its experts, as an
// ep = 1 Gpt: each expert tensor all-gathered over ep (the shards are whole experts in rank
// order, so the gathered buffer is the tensor). Collective over `ep`; the model on ep rank
// 0, null elsewhere.
std::unique_ptr<model::Gpt> gather_ep_shards(const model::Gpt& gpt, comm::Group& ep,
                                             const model::GptConfig& config, uint64_t seed) {
  std::unique_ptr<model::Gpt> whole;
  if (ep.rank() == 0)
    whole =
        std::make_unique<model::Gpt>(config, seed, model::StoreOptions{}, gpt.tp(), gpt.parts());
  const auto& mine = gpt.params().params();
  std::vector<float> gathered;
  for (size_t i = 0; i < mine.size(); ++i) {
    const model::Param& prm = mine[i];
    if (!prm.spec.expert) {
      if (whole) whole->params().params()[i].value.copy_from(prm.value);
      continue;
    }
    const int64_t n = prm.value.numel();
    gathered.resize(static_cast<size_t>(n * ep.size()));
    ep.all_gather(comm::Buf(const_cast<float*>(prm.value.f32()), n),
                  comm::Buf(gathered.data(), n * ep.size()));
    if (whole)
      std::copy_n(gathered.begin(), n * ep.size(), whole->params().params()[i].value.f32());
  }
  return whole;
}

// The whole model on world rank 0, for export, when it is spread over tp or pp ranks:
// ZeRO-3 shards gathered over dp (every rank), tp shards over the tp group of dp rank 0,
// and the pipeline stages of that replica sent to the first stage, parameter by parameter
// (the last stage's tied wte copy equals the first stage's and stays home). Returns null
// on every other rank.
std::unique_ptr<model::Gpt> gather_whole_model(Replica& rep, comm::Group& tp_group,
                                               comm::Group& ppg, const TrainOptions& o,
                                               const parallel::pp::Schedule* sched,
                                               const parallel::pp::Partition* part) {
  rep.materialize_full();
  if (rep.dp.rank() != 0) return nullptr;
  std::unique_ptr<model::Gpt> experts, stage;
  model::Gpt* mine = &rep.gpt;
  if (rep.gpt.ep().active()) {  // the ep group of a replica's first rank: all have dp rank 0
    experts = gather_ep_shards(rep.gpt, *rep.gpt.ep().group, o.model, o.seed);
    if (!experts) return nullptr;
    mine = experts.get();
  }
  if (o.tp > 1) {
    stage = gather_tp_shards(*mine, tp_group, o.model, o.seed);
    mine = stage.get();
  }
  if (tp_group.rank() != 0) return nullptr;
  if (o.pipeline.pp == 1) return stage ? std::move(stage) : std::move(experts);
  const int p = ppg.rank();
  if (p != 0) {
    for (const model::Param& prm : mine->params().params())
      if (!(prm.spec.name == "transformer.wte.weight" && !mine->parts().embedding))
        ppg.send(comm::Buf(prm.value), 0);
    return nullptr;
  }
  auto whole = std::make_unique<model::Gpt>(o.model, o.seed);
  for (const model::Param& prm : mine->params().params())
    whole->params().get(prm.spec.name).value.copy_from(prm.value);
  for (int q = 1; q < o.pipeline.pp; ++q)
    for (const model::ParamSpec& spec :
         model::stage_param_specs(whole->config(), stage_parts(*sched, *part, q)))
      if (!(spec.name == "transformer.wte.weight" && q != 0))
        ppg.recv(comm::Buf(whole->params().get(spec.name).value), q);
  return whole;
}

// A host copy of a GPU rank's whole model (tp = pp = 1), for export.
std::unique_ptr<model::Gpt> host_copy(const model::Gpt& gpt, const TrainOptions& o) {
  device::ScopedCpu cpu;
  auto whole = std::make_unique<model::Gpt>(o.model, o.seed);
  for (const model::Param& prm : gpt.params().params())
    whole->params().get(prm.spec.name).value.copy_from(prm.value);
  return whole;
}

}  // namespace mt::train
