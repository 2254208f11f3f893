// The device mesh: named parallel dimensions (pp, dp, ep, cp, tp) with sizes and an order,
// rank <-> coordinates, and one Group per dimension or set of dimensions.
//
// The default order, slowest to fastest, is pp, dp, ep, cp, tp: tp varies fastest, so a tp
// group is a block of consecutive ranks (the GPUs of one node on a real cluster).
//   rank = ((((pp * DP + dp) * EP + ep) * CP + cp) * TP + tp)
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/group.h"

namespace mt::comm {

// The five dimension names, in the default order (slowest to fastest).
const std::vector<std::string>& mesh_dim_names();

// The shape alone: checked before any work, no communication.
class MeshShape {
 public:
  // `sizes`: (name, size) pairs; dimensions not named have size 1. `order`: slowest to
  // fastest, all five names once (empty: the default). Refuses a bad mesh (mt::Error, exit
  // code 2) with a message naming the value and the fix: an unknown or repeated name, a
  // size < 1, a product of sizes different from `world_size`.
  MeshShape(const std::vector<std::pair<std::string, int>>& sizes, int world_size,
            std::vector<std::string> order = {});

  int world_size() const { return world_size_; }
  int size(std::string_view dim) const;
  const std::vector<std::string>& order() const { return order_; }
  int coord(int rank, std::string_view dim) const;
  std::map<std::string, int> coords(int rank) const;
  int rank_of(const std::map<std::string, int>& coords) const;  // missing dims = 0

  // The group of `dims` that holds `rank`: the ranks agreeing with it on every other
  // dimension, in group-rank order (the named dims' coordinates, mesh order).
  std::vector<int> group_ranks(const std::vector<std::string>& dims, int rank) const;
  int group_rank(const std::vector<std::string>& dims, int rank) const;
  int group_index(const std::vector<std::string>& dims, int rank) const;
  // "tp[1]", "dp_cp[0]" (dims in mesh order, joined by '_').
  std::string group_name(const std::vector<std::string>& dims, int rank) const;
  std::string str() const;  // "pp=1 dp=2 ep=1 cp=1 tp=4"

 private:
  std::vector<std::string> canonical(const std::vector<std::string>& dims) const;
  int index_of(std::string_view dim) const;
  int world_size_;
  std::vector<std::string> order_;  // slowest to fastest
  std::vector<int> sizes_;          // by position in order_
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank builds the same mesh; creates one group per
  // dimension (world.split), in order. The mesh keeps a reference to `world`.
  DeviceMesh(Group& world, MeshShape shape);
  ~DeviceMesh();

  const MeshShape& shape() const { return shape_; }
  int rank() const { return world_.rank(); }
  int coord(std::string_view dim) const { return shape_.coord(rank(), dim); }
  Group& world() { return world_; }
  Group& group(std::string_view dim);
  // A group spanning several dimensions (e.g. {"dp", "cp"}). The first request for a given
  // set is a collective over the world: every rank makes it, in the same order.
  Group& group(const std::vector<std::string>& dims);
  Group& group(std::initializer_list<std::string> dims) {
    return group(std::vector<std::string>(dims));
  }

 private:
  Group& world_;
  MeshShape shape_;
  std::map<std::string, std::unique_ptr<Group>> groups_;  // by canonical name "dp_cp"
};

}  // namespace mt::comm
