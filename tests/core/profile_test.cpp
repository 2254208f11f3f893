// The per-thread profile (`train --profile`): nested regions count their own time only, so
// the entries add up to the time profiled. Relations between the entries, never a duration.
#include "core/profile.h"

#include <gtest/gtest.h>

#include "core/clock.h"

namespace mt::profile {
namespace {

// Keeps the thread busy until `s` seconds have passed since it was called.
void spin_for(double s) {
  const double t0 = now_s();
  while (now_s() - t0 < s) {
  }
}

TEST(Profile, NestedRegionsCountTheirOwnTimeAndAddUpToTheWhole) {
  enable(true);
  reset();
  const double t0 = now_s();
  {
    Scope outer("outer");
    {
      Scope inner("inner");
      spin_for(0.02);
    }
    {
      Scope inner("inner");
      Scope innermost("innermost");
      spin_for(0.02);
    }
  }
  const double whole = now_s() - t0;
  enable(false);
  const Entry o = entries().at("outer"), i = entries().at("inner"), m = entries().at("innermost");
  EXPECT_EQ(o.calls, 1);
  EXPECT_EQ(i.calls, 2);
  EXPECT_EQ(m.calls, 1);
  // outer's own work is two scope changes; inner's is a spin of 20 ms; innermost's another.
  // Counted inclusively, outer would hold both spins and inner the second.
  EXPECT_LT(o.time_s, i.time_s);
  EXPECT_LT(o.time_s, m.time_s);
  EXPECT_GE(o.time_s, 0.0);
  // The three entries are disjoint parts of the whole.
  EXPECT_LE(o.time_s + i.time_s + m.time_s, whole);
  EXPECT_GE(o.time_s + i.time_s + m.time_s, 0.04);  // both spins, each counted once
  reset();
}

TEST(Profile, OffCountsNothingAndLeavesNoOpenRegion) {
  enable(false);
  reset();
  {
    Scope s("x");
  }
  EXPECT_TRUE(entries().empty());
  EXPECT_EQ(innermost(), nullptr);
  enable(true);
  {
    Scope s("x");
    EXPECT_NE(innermost(), nullptr);
  }
  EXPECT_EQ(innermost(), nullptr);
  enable(false);
  reset();
}

}  // namespace
}  // namespace mt::profile
