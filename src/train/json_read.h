// Numbers out of untrusted JSON (a file from elsewhere: a safetensors header, a checkpoint
// index). nlohmann's get<int64_t>() of 1e300 is undefined behaviour (a float-to-integer
// conversion out of range) and get<int>() of 2^40 a silent wrap: these refuse both, naming
// the file. docs/fuzzing.md.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace mt::train {

// v as an integer in [lo, hi]; else refused as "FILE: WHAT must be an integer in [lo, hi],
// not V".
inline int64_t json_integer(const nlohmann::json& v, const std::string& file, const char* what,
                            int64_t lo = std::numeric_limits<int64_t>::min(),
                            int64_t hi = std::numeric_limits<int64_t>::max()) {
  bool fits = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    fits = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    x = fits ? static_cast<int64_t>(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    fits = true;
  }
  if (!fits || x < lo || x > hi) {
    std::string text = v.dump();
    if (text.size() > 40) text = text.substr(0, 40) + "...";
    fail("{}: {} must be an integer in [{}, {}], not {}", file, what, lo, hi, text);
  }
  return x;
}

// A uint64 (a seed): any integer in [0, 2^64).
inline uint64_t json_uint64(const nlohmann::json& v, const std::string& file, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  return static_cast<uint64_t>(json_integer(v, file, what, 0));
}

}  // namespace mt::train
