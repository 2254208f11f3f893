// Writing a whole file so that it is either complete or not there: every write checked, a
// failure (a full disk, an unwritable place) an mt::Error at once that names the file and
// the reason, and no temporary file left behind.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mt::io {

struct Chunk {
  const void* data;
  size_t bytes;
};

// Writes the chunks, in order, as `path`: into `path`.tmp, fsynced, renamed over `path`,
// then the folder fsynced, so a crash or a failure leaves the old file (or none) and never
// half of one. An existing `path` that is not a regular file (/dev/null, /dev/stdout, a pipe,
// a device) is written in place: a rename would replace the device itself. Throws mt::Error
// naming `path`: exit code 2 when it cannot be created (a missing or unwritable folder), 1
// when a write, the fsync or the rename fails; the temporary file is removed first.
void write_file(const std::string& path, const std::vector<Chunk>& chunks);
void write_file(const std::string& path, std::string_view text);

// Bytes free to an unprivileged writer on the file system that holds `path` (the path, or
// its nearest existing parent); -1 when unknown.
long long free_bytes(const std::string& path);

}  // namespace mt::io
