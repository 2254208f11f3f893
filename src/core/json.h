// JSON text from elsewhere (a safetensors header, a checkpoint index, a config or cluster
// file), parsed with its nesting bounded: nlohmann::json parses and frees any depth without
// recursion, but dump() recurses, so a file of a million '[' would overflow the stack when a
// value of it is printed in a message or written back. Every format of ours nests a few
// levels. docs/fuzzing.md.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"

namespace mt {

inline constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse of `text`; throws its parse_error on malformed JSON and mt::Error on
// nesting deeper than kMaxJsonDepth (the caller names the file).
inline nlohmann::json parse_json(std::string_view text) {
  return nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      fail("JSON nested more than {} levels deep (no file of this kind is)", kMaxJsonDepth);
    return true;
  });
}

}  // namespace mt
