// What `calibrate` measures across hosts beyond α and the bandwidth (docs/multihost.md): the
// inter-host all-reduce by message size. Every rank of the job calls it at once.
#pragma once

#include "comm/group.h"
#include "plan/hardware.h"

namespace mt::cli {

// The all-reduce's median time over `g` (nullptr: this rank's group is itself alone) at sizes
// from 1 KiB to 16 MiB (`quick`: 1 MiB) in x4 steps, every group of the job timing its own at
// the same time (as training loads the links).
plan::LinkCurve allreduce_curve(comm::Group& world, comm::Group* g, bool quick);

}  // namespace mt::cli
