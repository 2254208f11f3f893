#include "comm/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace mt::comm {

const std::vector<std::string>& mesh_dim_names() {
  static const std::vector<std::string> kNames = {"pp", "dp", "ep", "cp", "tp"};
  return kNames;
}

namespace {
bool known(std::string_view d) {
  const auto& k = mesh_dim_names();
  return std::find(k.begin(), k.end(), d) != k.end();
}
}  // namespace

MeshShape::MeshShape(const std::vector<std::pair<std::string, int>>& sizes, int world_size,
                     std::vector<std::string> order)
    : world_size_(world_size), order_(order.empty() ? mesh_dim_names() : std::move(order)) {
  for (const auto& d : order_)
    if (!known(d))
      fail("mesh order names '{}', which is not a dimension; use pp, dp, ep, cp, tp", d);
  for (const auto& d : mesh_dim_names())
    if (std::count(order_.begin(), order_.end(), d) != 1)
      fail("mesh order must name each of pp, dp, ep, cp, tp exactly once; '{}' appears {} times", d,
           std::count(order_.begin(), order_.end(), d));
  sizes_.assign(order_.size(), 1);
  std::vector<std::string> seen;
  for (const auto& [name, size] : sizes) {
    if (!known(name)) fail("mesh dimension '{}' is unknown; use pp, dp, ep, cp or tp", name);
    if (std::find(seen.begin(), seen.end(), name) != seen.end())
      fail("mesh dimension '{}' is given twice; give each dimension at most once", name);
    seen.push_back(name);
    if (size < 1)
      fail(
          "mesh dimension {} has size {}; every size must be at least 1 (use 1 to leave {} "
          "unused)",
          name, size, name);
    sizes_[static_cast<size_t>(index_of(name))] = size;
  }
  int64_t product = 1;
  for (int s : sizes_) product *= s;
  if (world_size < 1) fail("the world has {} ranks; it needs at least 1", world_size);
  if (product != world_size) {
    std::string hint;
    int64_t rest = product / size("dp");
    if (world_size % rest == 0) hint = fmt::format(" (e.g. dp={})", world_size / rest);
    fail("mesh {} has {} ranks but the world has {}; make the product of the sizes equal {}{}",
         str(), product, world_size, world_size, hint);
  }
}

int MeshShape::index_of(std::string_view dim) const {
  for (size_t i = 0; i < order_.size(); ++i)
    if (order_[i] == dim) return static_cast<int>(i);
  fail("mesh dimension '{}' is unknown; use pp, dp, ep, cp or tp", dim);
}

int MeshShape::size(std::string_view dim) const {
  return sizes_[static_cast<size_t>(index_of(dim))];
}

std::string MeshShape::str() const {
  std::string s;
  for (size_t i = 0; i < order_.size(); ++i)
    s += fmt::format("{}{}={}", i ? " " : "", order_[i], sizes_[i]);
  return s;
}

int MeshShape::coord(int rank, std::string_view dim) const {
  if (rank < 0 || rank >= world_size_)
    fail("rank {} is outside the mesh of {} ranks", rank, world_size_);
  int k = index_of(dim);
  int stride = 1;
  for (size_t i = static_cast<size_t>(k) + 1; i < order_.size(); ++i) stride *= sizes_[i];
  return rank / stride % sizes_[static_cast<size_t>(k)];
}

std::map<std::string, int> MeshShape::coords(int rank) const {
  std::map<std::string, int> c;
  for (const auto& d : order_) c[d] = coord(rank, d);
  return c;
}

int MeshShape::rank_of(const std::map<std::string, int>& coords) const {
  int rank = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    auto it = coords.find(order_[i]);
    int c = it == coords.end() ? 0 : it->second;
    if (c < 0 || c >= sizes_[i])
      fail("mesh coordinate {}={} is outside 0..{}", order_[i], c, sizes_[i] - 1);
    rank = rank * sizes_[i] + c;
  }
  return rank;
}

std::vector<std::string> MeshShape::canonical(const std::vector<std::string>& dims) const {
  for (const auto& d : dims) index_of(d);
  for (size_t i = 0; i < dims.size(); ++i)
    for (size_t j = i + 1; j < dims.size(); ++j)
      if (dims[i] == dims[j]) fail("mesh group names '{}' twice", dims[i]);
  std::vector<std::string> c;
  for (const auto& d : order_)
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) c.push_back(d);
  return c;
}

std::vector<int> MeshShape::group_ranks(const std::vector<std::string>& dims, int rank) const {
  auto in = canonical(dims);
  auto base = coords(rank);
  int count = 1;
  for (const auto& d : in) count *= size(d);
  std::vector<int> ranks;
  for (int g = 0; g < count; ++g) {
    auto c = base;
    int rest = g;
    for (auto it = in.rbegin(); it != in.rend(); ++it) {
      c[*it] = rest % size(*it);
      rest /= size(*it);
    }
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int MeshShape::group_rank(const std::vector<std::string>& dims, int rank) const {
  int g = 0;
  for (const auto& d : canonical(dims)) g = g * size(d) + coord(rank, d);
  return g;
}

int MeshShape::group_index(const std::vector<std::string>& dims, int rank) const {
  auto in = canonical(dims);
  int g = 0;
  for (const auto& d : order_)
    if (std::find(in.begin(), in.end(), d) == in.end()) g = g * size(d) + coord(rank, d);
  return g;
}

std::string MeshShape::group_name(const std::vector<std::string>& dims, int rank) const {
  std::string s;
  for (const auto& d : canonical(dims)) s += (s.empty() ? "" : "_") + d;
  return fmt::format("{}[{}]", s, group_index(dims, rank));
}

DeviceMesh::DeviceMesh(Group& world, MeshShape shape) : world_(world), shape_(std::move(shape)) {
  if (shape_.world_size() != world.size())
    fail("mesh {} is for {} ranks but the world group has {}", shape_.str(), shape_.world_size(),
         world.size());
  for (const auto& d : shape_.order()) group(std::vector<std::string>{d});
}

DeviceMesh::~DeviceMesh() = default;

Group& DeviceMesh::group(std::string_view dim) {
  return group(std::vector<std::string>{std::string(dim)});
}

Group& DeviceMesh::group(const std::vector<std::string>& dims) {
  std::string name = shape_.group_name(dims, rank());
  std::string key = name.substr(0, name.find('['));
  auto& slot = groups_[key];
  if (!slot) {
    slot = world_.split(shape_.group_index(dims, rank()), shape_.group_rank(dims, rank()), name);
    // Mesh ranks are ranks of `world_`, which may be the job's world reordered (host by
    // host, comm/hosts.h): compare the job's ranks.
    std::vector<int> expected;
    for (int r : shape_.group_ranks(dims, rank()))
      expected.push_back(world_.world_ranks()[static_cast<size_t>(r)]);
    MT_ASSERT(slot && slot->world_ranks() == expected);
  }
  return *slot;
}

}  // namespace mt::comm
