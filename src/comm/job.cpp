#include "comm/job.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/clock.h"

namespace mt::comm {

Job::~Job() { stop_watchdog(); }

void Job::add_rank(std::shared_ptr<RankContext> rank) {
  std::lock_guard lock(mu_);
  ranks_[rank->world_rank] = std::move(rank);
}

void Job::register_group(const std::string& name, const std::vector<int>& world_ranks) {
  std::lock_guard lock(mu_);
  groups_[name] = world_ranks;
}

std::vector<int> Job::group_members(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = groups_.find(name);
  return it == groups_.end() ? std::vector<int>{} : it->second;
}

std::shared_ptr<RankContext> Job::rank_context(int world_rank) const {
  std::lock_guard lock(mu_);
  auto it = ranks_.find(world_rank);
  return it == ranks_.end() ? nullptr : it->second;
}

std::string Job::abort_reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

void Job::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.load()) return;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  on_abort();
  run_abort_hooks();
}

bool Job::abort_unwinding(int world_rank) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.load()) return true;
    reason_ = fmt::format("[rank {}] failed while its communication was in flight", world_rank);
    unwinding_rank_ = world_rank;
    aborted_.store(true, std::memory_order_release);
  }
  on_abort();
  run_abort_hooks();
  return true;
}

int Job::unwinding_rank() const {
  std::lock_guard lock(mu_);
  return unwinding_rank_;
}

int Job::add_abort_hook(std::function<void()> hook) {
  std::unique_lock lock(hooks_mu_);
  if (aborted()) {
    hook();
    return 0;
  }
  int id = next_hook_++;
  hooks_[id] = std::move(hook);
  return id;
}

void Job::remove_abort_hook(int id) {
  std::lock_guard lock(hooks_mu_);
  hooks_.erase(id);
}

void Job::run_abort_hooks() {
  // Under the hooks' mutex: remove_abort_hook waits for a running hook.
  std::lock_guard lock(hooks_mu_);
  for (auto& [id, hook] : hooks_) hook();
  hooks_.clear();
}

namespace {
std::string rank_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}
}  // namespace

std::string Job::rank_activity(int world_rank, const std::string& group, int64_t seq, OpType op,
                               bool* arrived, bool* differs) {
  *arrived = false;
  *differs = false;
  auto ctx = rank_context(world_rank);
  if (!ctx) return "is unknown to this process";
  OpRecord rec;
  if (seq > 0 && ctx->recorder.find_collective(group, seq, &rec)) {
    if (rec.op == op) {
      *arrived = true;
      return fmt::format("is in {} ({})", describe(rec), state_name(rec.state));
    }
    *differs = true;
    return fmt::format("is in {}", describe(rec));
  }
  auto flying = ctx->recorder.in_flight();
  if (!flying.empty()) {
    std::string s = "is in ";
    for (size_t i = 0; i < flying.size(); ++i)
      s += (i ? "; " : "") + describe(flying[i]) + " (" + std::string(state_name(flying[i].state)) +
           ")";
    return s;
  }
  auto last = ctx->recorder.last(1);
  if (last.empty()) return "has no op in flight and has done none";
  return fmt::format("has no op in flight; its last op was {} ({})", describe(last.back()),
                     state_name(last.back().state));
}

std::string Job::base_diagnosis(const RankContext& rank, const OpRecord& stuck) {
  double waited = now_s() - (stuck.started_s > 0 ? stuck.started_s : stuck.queued_s);
  std::string d = fmt::format(
      "[rank {}] comm watchdog: {} not done after {:.1f} s (timeout {:g} s, --comm-timeout)",
      rank.world_rank, describe(stuck), waited, timeout_s_);
  std::vector<int> members = group_members(stuck.group);
  if (!is_collective(stuck.op)) {
    int peer_world =
        stuck.peer >= 0 && stuck.peer < static_cast<int>(members.size()) ? members[stuck.peer] : -1;
    bool a, b;
    d += fmt::format("\n  its peer, world rank {}, {}", peer_world,
                     rank_activity(peer_world, "", 0, stuck.op, &a, &b));
    return d;
  }
  d += fmt::format("\n  group {} = world ranks [{}]", stuck.group, rank_list(members));
  std::vector<int> arrived, missing, differing;
  std::vector<std::string> activity;
  for (int r : members) {
    bool a = false, df = false;
    std::string act = rank_activity(r, stuck.group, stuck.seq, stuck.op, &a, &df);
    if (a)
      arrived.push_back(r);
    else
      missing.push_back(r);
    if (df) differing.push_back(r);
    if (!a && !df) activity.push_back(fmt::format("  rank {} {}", r, act));
    if (df) {
      // "rank 3 is in all_gather #812 on tp[1], the others in all_reduce #812"
      d +=
          fmt::format("\n  rank {} {}, the others in {} #{}", r, act, op_name(stuck.op), stuck.seq);
    }
  }
  d += fmt::format("\n  arrived at {} #{}: ranks [{}]; not arrived: ranks [{}]", op_name(stuck.op),
                   stuck.seq, rank_list(arrived), rank_list(missing));
  for (const auto& a : activity) d += "\n" + a;
  return d;
}

std::string Job::diagnose(const RankContext& rank, const OpRecord& stuck) {
  return base_diagnosis(rank, stuck);
}

void Job::start_watchdog() {
  if (watchdog_.joinable()) return;
  wd_stop_ = false;
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

void Job::stop_watchdog() {
  {
    std::lock_guard lock(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void Job::watchdog_loop() {
  double period = std::clamp(timeout_s_ / 10, 0.05, 1.0);
  std::unique_lock lock(wd_mu_);
  while (!wd_stop_) {
    wd_cv_.wait_for(lock, std::chrono::duration<double>(period));
    if (wd_stop_ || aborted()) break;
    std::vector<std::shared_ptr<RankContext>> ranks;
    {
      std::lock_guard l2(mu_);
      for (auto& [r, c] : ranks_) ranks.push_back(c);
    }
    double now = now_s();
    for (auto& ctx : ranks) {
      for (const OpRecord& rec : ctx->recorder.in_flight()) {
        if (rec.state != OpState::kStarted || now - rec.started_s < timeout_s_ + watchdog_delay_s())
          continue;
        lock.unlock();
        abort(diagnose(*ctx, rec));
        return;
      }
    }
  }
}

}  // namespace mt::comm
