// The planner's cluster file reader (plan/hardware.h: `--cluster FILE.json`, and the
// this-host file `meshtrain calibrate` writes): the JSON, its fields and their ranges.
#include "fuzz.h"
#include "plan/hardware.h"

using namespace mt;

MT_FUZZ_TARGET(cluster_file) {
  const std::string path = fuzz::write_input("cluster.json", bytes);
  fuzz::read_or_refuse(path, [&] {
    const plan::ClusterSpec c = plan::cluster_preset(path);
    // The planner asks for the links of a job by its rank count.
    for (int64_t ranks : {1, 2, 8, 1024}) (void)c.for_job(ranks);
  });
}
