#include "core/host_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace mt::host_memory {

namespace {

namespace fs = std::filesystem;

// A cgroup "limit" this large means none (v1 writes 2^63 rounded down to a page).
constexpr int64_t kNoLimit = int64_t{1} << 60;

// The first number in a file ("max" and a missing file: -1).
int64_t read_number(const fs::path& p) {
  std::ifstream in(p);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  char* end = nullptr;
  const long long v = std::strtoll(word.c_str(), &end, 10);
  return end && *end == '\0' && v >= 0 ? static_cast<int64_t>(v) : -1;
}

// A "key value" line of memory.stat (v1: total_inactive_file; v2: inactive_file).
int64_t read_stat(const fs::path& p, const std::string& key) {
  std::ifstream in(p);
  std::string k;
  long long v = 0;
  while (in >> k >> v)
    if (k == key) return static_cast<int64_t>(v);
  return 0;
}

struct CgroupLimit {
  int64_t free_bytes = -1;  // limit - working set of the tightest level; -1: no limit
  int64_t limit_bytes = -1;
  std::string path;
};

// Walks from the process's cgroup `rel` up to the hierarchy's root `mount`, keeping the
// level with the least room.
void walk(const fs::path& mount, std::string rel, bool v2, CgroupLimit& best) {
  while (true) {
    const fs::path dir = mount / fs::path(rel).relative_path();
    const int64_t limit = read_number(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
    if (limit >= 0 && limit < kNoLimit) {
      const int64_t usage = read_number(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
      const int64_t inactive =
          read_stat(dir / "memory.stat", v2 ? "inactive_file" : "total_inactive_file");
      const int64_t used = usage < 0 ? 0 : std::max<int64_t>(0, usage - inactive);
      const int64_t free_bytes = std::max<int64_t>(0, limit - used);
      if (best.free_bytes < 0 || free_bytes < best.free_bytes)
        best = {free_bytes, limit, rel.empty() ? "/" : rel};
    }
    if (rel.empty() || rel == "/") break;
    rel = fs::path(rel).parent_path().string();
    if (rel == "/") rel.clear();
  }
}

CgroupLimit cgroup_limit() {
  CgroupLimit best;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "id:controllers:path"; v2's line is "0::path".
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), rel = line.substr(b + 1);
    if (controllers.empty()) {
      std::error_code ec;
      const fs::path mount = fs::exists("/sys/fs/cgroup/cgroup.controllers", ec)
                                 ? fs::path("/sys/fs/cgroup")
                                 : fs::path("/sys/fs/cgroup/unified");
      walk(mount, rel, true, best);
    } else {
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');)
        if (c == "memory") walk("/sys/fs/cgroup/memory", rel, false, best);
    }
  }
  return best;
}

std::string gb(int64_t bytes) { return fmt::format("{:.1f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace

Available available() {
  Available a;
  if (const char* env = std::getenv("MESHTRAIN_HOST_MEMORY")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (!end || *end != '\0' || !(v > 0))
      fail("MESHTRAIN_HOST_MEMORY '{}' must be a positive number of bytes (e.g. 8e9)", env);
    a.bytes = static_cast<int64_t>(v);
    a.source = "MESHTRAIN_HOST_MEMORY";
    return a;
  }
  std::ifstream mi("/proc/meminfo");
  std::string key;
  long long kb = 0;
  while (mi >> key >> kb) {
    if (key == "MemAvailable:") {
      a.bytes = static_cast<int64_t>(kb) * 1024;
      a.source = "MemAvailable in /proc/meminfo";
      break;
    }
    mi.ignore(256, '\n');
  }
  const CgroupLimit c = cgroup_limit();
  if (c.free_bytes >= 0 && (a.bytes < 0 || c.free_bytes < a.bytes)) {
    a.bytes = c.free_bytes;
    a.source = fmt::format("the memory limit of cgroup {} ({}), less what it uses", c.path,
                           gb(c.limit_bytes));
  }
  return a;
}

}  // namespace mt::host_memory
