// DeviceMesh shape: rank <-> coordinates, default order, groups, and refusals.
#include "comm/mesh.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace mt::comm {
namespace {

std::string refusal(const std::vector<std::pair<std::string, int>>& sizes, int world,
                    std::vector<std::string> order = {}) {
  try {
    MeshShape m(sizes, world, order);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return "";
}

TEST(MeshShape, TpVariesFastestThenCpEpDpPp) {
  MeshShape m({{"pp", 2}, {"dp", 2}, {"cp", 2}, {"tp", 2}}, 16);
  EXPECT_EQ(m.str(), "pp=2 dp=2 ep=1 cp=2 tp=2");
  EXPECT_EQ(m.coord(1, "tp"), 1);
  EXPECT_EQ(m.coord(2, "cp"), 1);
  EXPECT_EQ(m.coord(4, "dp"), 1);
  EXPECT_EQ(m.coord(8, "pp"), 1);
  for (int r = 0; r < 16; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  EXPECT_EQ(m.group_ranks({"tp"}, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks({"dp"}, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group_ranks({"dp", "cp"}, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(m.group_ranks({"cp", "dp"}, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(m.group_name({"tp"}, 5), "tp[2]");
  EXPECT_EQ(m.group_name({"cp", "dp"}, 9), "dp_cp[3]");
  EXPECT_EQ(m.group_rank({"dp", "cp"}, 6), 3);
}

TEST(MeshShape, CustomOrder) {
  MeshShape m({{"dp", 2}, {"tp", 4}}, 8, {"tp", "pp", "ep", "cp", "dp"});
  EXPECT_EQ(m.group_ranks({"dp"}, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks({"tp"}, 0), (std::vector<int>{0, 2, 4, 6}));
}

TEST(MeshShape, RefusesBadMeshesNamingTheValueAndTheFix) {
  EXPECT_NE(
      refusal({{"dp", 2}, {"tp", 2}}, 8)
          .find(
              "has 4 ranks but the world has 8; make the product of the sizes equal 8 (e.g. dp=4)"),
      std::string::npos);
  EXPECT_NE(refusal({{"tp", 0}}, 1).find("tp has size 0; every size must be at least 1"),
            std::string::npos);
  EXPECT_NE(refusal({{"xp", 2}}, 2).find("'xp' is unknown; use pp, dp, ep, cp or tp"),
            std::string::npos);
  EXPECT_NE(refusal({{"tp", 2}, {"tp", 2}}, 4).find("'tp' is given twice"), std::string::npos);
  EXPECT_NE(refusal({{"tp", 2}}, 2, {"tp", "tp", "dp", "cp", "ep"}).find("exactly once"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::comm
