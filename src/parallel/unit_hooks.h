// The points in a model's forward and backward where data parallelism acts. The model
// calls them around each of its units (the embeddings, each block, the head) so that
// ZeRO-3 can gather a unit's parameters just before they are read, and DDP / ZeRO can
// start reducing gradients as soon as backward has finished them, without the model
// knowing anything about communication.
#pragma once

namespace mt::parallel {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // `unit`'s parameter values are about to be read by its forward.
  virtual void before_forward(int /*unit*/) {}
  // `unit`'s parameter values are about to be read and its gradients written by backward.
  virtual void before_backward(int /*unit*/) {}
  // `unit`'s backward is done; from now on, no gradient of a parameter in this unit or in
  // any later unit changes in this microbatch (the model guarantees it: see Gpt::backward).
  virtual void after_backward(int /*unit*/) {}
};

}  // namespace mt::parallel

#include <vector>

namespace mt::parallel {

// Several hooks called in order (ZeRO-3: gather parameters, then prepare gradients).
class HookChain : public UnitHooks {
 public:
  explicit HookChain(std::vector<UnitHooks*> hooks) : hooks_(std::move(hooks)) {}
  void before_forward(int u) override {
    for (auto* h : hooks_) h->before_forward(u);
  }
  void before_backward(int u) override {
    for (auto* h : hooks_) h->before_backward(u);
  }
  void after_backward(int u) override {
    for (auto* h : hooks_) h->after_backward(u);
  }

 private:
  std::vector<UnitHooks*> hooks_;
};

}  // namespace mt::parallel
