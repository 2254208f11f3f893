// `meshtrain calibrate --device cuda` (calibrate_gpu.cpp): one GPU of this machine measured
// as a planner cluster file.
#pragma once

#include <string>

namespace mt::cli {

// Measures GPU 0 and writes the cluster file to `out_path`; `links_from` names the preset
// whose links (NVLink, network) the file takes ("": by the GPU's generation); `sustain_s`
// seconds of back-to-back GEMMs give compute_sustain (0: not measured, 1.0). Fails with the
// fix when the build has no CUDA or the machine no GPU.
void run_calibrate_gpu(const std::string& out_path, bool quick, const std::string& links_from,
                       double sustain_s);

}  // namespace mt::cli
