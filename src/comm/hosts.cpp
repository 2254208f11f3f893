#include "comm/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <map>

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

std::unique_ptr<Group> order_by_host(Group& world, const HostMap& hosts, const std::string& name) {
  if (hosts.hosts() <= 1) return nullptr;
  // This rank's place: the ranks of lower hosts, then this host's lower ranks, before it.
  const int mine = hosts.host_of_rank[static_cast<size_t>(world.rank())];
  int key = 0;
  for (int r = 0; r < world.size(); ++r) {
    const int h = hosts.host_of_rank[static_cast<size_t>(r)];
    if (h < mine || (h == mine && r < world.rank())) ++key;
  }
  return world.split(0, key, name);
}

bool spans_hosts(const Group& group, const HostMap& hosts) {
  const std::vector<int>& members = group.world_ranks();
  for (int r : members)
    if (hosts.host_of_rank.at(static_cast<size_t>(r)) !=
        hosts.host_of_rank.at(static_cast<size_t>(members[0])))
      return true;
  return false;
}

std::string describe_placement(const std::vector<std::pair<std::string, bool>>& dims_across,
                               const HostMap& hosts) {
  std::string inside, across;
  for (const auto& [dim, crosses] : dims_across) {
    std::string& list = crosses ? across : inside;
    list += (list.empty() ? "" : ", ") + dim;
  }
  std::string s =
      fmt::format("{} hosts (up to {} ranks each)", hosts.hosts(), hosts.max_ranks_per_host());
  if (!inside.empty()) s += "; " + inside + " inside hosts";
  s += "; " + (across.empty() ? std::string("no dimension") : across) + " across hosts";
  return s;
}

}  // namespace mt::comm
