#include "comm/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"

namespace mt::comm {

namespace {
constexpr int kNameElems = 64;  // host names travel as 64 floats (one byte each, 0-padded)
}

int HostMap::max_ranks_per_host() const {
  std::vector<int> count(names.size(), 0);
  for (int h : host_of_rank) ++count[static_cast<size_t>(h)];
  return count.empty() ? 0 : *std::max_element(count.begin(), count.end());
}

std::string this_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "?";
  return buf;
}

HostMap exchange_host_names(Group& world) {
  const std::string mine = this_host_name();
  std::vector<float> in(kNameElems, 0.0f), out(static_cast<size_t>(kNameElems * world.size()));
  for (size_t i = 0; i < mine.size() && i + 1 < kNameElems; ++i)
    in[i] = static_cast<float>(static_cast<unsigned char>(mine[i]));
  world.all_gather(Buf(in.data(), kNameElems), Buf(out.data(), static_cast<int64_t>(out.size())));
  HostMap m;
  std::map<std::string, int> index;
  for (int r = 0; r < world.size(); ++r) {
    std::string name;
    for (int i = 0; i < kNameElems; ++i) {
      const float c = out[static_cast<size_t>(r * kNameElems + i)];
      if (c == 0.0f) break;
      name += static_cast<char>(static_cast<unsigned char>(c));
    }
    auto [it, added] = index.emplace(name, m.hosts());
    if (added) m.names.push_back(name);
    m.host_of_rank.push_back(it->second);
  }
  return m;
}

namespace {
std::vector<int> host_major_order(const HostMap& hosts) {  // position -> rank
  std::vector<int> ranks(hosts.host_of_rank.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    return hosts.host_of_rank[static_cast<size_t>(a)] < hosts.host_of_rank[static_cast<size_t>(b)];
  });
  return ranks;
}
}  // namespace

std::unique_ptr<Group> order_by_host(Group& world, const HostMap& hosts, const std::string& name) {
  if (hosts.hosts() <= 1) return nullptr;
  const std::vector<int> order = host_major_order(hosts);
  const int key =
      static_cast<int>(std::find(order.begin(), order.end(), world.rank()) - order.begin());
  return world.split(0, key, name);
}

HostMap reorder_by_host(const HostMap& hosts) {
  HostMap m = hosts;
  const std::vector<int> order = host_major_order(hosts);
  for (size_t pos = 0; pos < order.size(); ++pos)
    m.host_of_rank[pos] = hosts.host_of_rank[static_cast<size_t>(order[pos])];
  return m;
}

std::vector<std::string> dims_across_hosts(const MeshShape& shape, const HostMap& hosts) {
  MT_ASSERT(static_cast<int>(hosts.host_of_rank.size()) == shape.world_size());
  std::vector<std::string> across;
  for (const std::string& dim : shape.order()) {
    if (shape.size(dim) <= 1) continue;
    bool crosses = false;
    for (int r = 0; r < shape.world_size() && !crosses; ++r)
      for (int peer : shape.group_ranks({dim}, r))
        if (hosts.host_of_rank[static_cast<size_t>(peer)] !=
            hosts.host_of_rank[static_cast<size_t>(r)])
          crosses = true;
    if (crosses) across.push_back(dim);
  }
  return across;
}

std::string describe_placement(const MeshShape& shape, const HostMap& hosts) {
  const std::vector<std::string> across = dims_across_hosts(shape, hosts);
  std::vector<std::string> inside;
  for (const std::string& dim : shape.order())
    if (shape.size(dim) > 1 && std::find(across.begin(), across.end(), dim) == across.end())
      inside.push_back(dim);
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::string s =
      fmt::format("{} hosts (up to {} ranks each)", hosts.hosts(), hosts.max_ranks_per_host());
  if (!inside.empty()) s += "; " + join(inside) + " inside hosts";
  s += "; " + (across.empty() ? std::string("no dimension") : join(across)) + " across hosts";
  return s;
}

}  // namespace mt::comm
