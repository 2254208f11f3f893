#include "core/write_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace mt::io {

namespace fs = std::filesystem;

namespace {

// write(2) until done; false (errno set) on an error.
bool write_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void write_file(const std::string& path, const std::vector<Chunk>& chunks) {
  std::error_code ec;
  const bool in_place = fs::exists(path, ec) && !fs::is_regular_file(path, ec);
  if (in_place && fs::is_directory(path, ec))
    fail("cannot write '{}': it is a folder (name a file)", path);
  const std::string target = in_place ? path : path + ".tmp";
  const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("cannot write '{}': {} (does the folder exist, and is it writable?)", target,
         std::strerror(errno));
  auto give_up = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    if (!in_place) fs::remove(target, ec);
    fail_run(
        "{} '{}' failed: {}{}", what, target, std::strerror(err),
        err == ENOSPC || err == EDQUOT ? " (the disk is full: free space or write elsewhere)" : "");
  };
  for (const Chunk& c : chunks)
    if (!write_all(fd, c.data, c.bytes)) give_up("writing");
  // A device or a pipe has nothing to sync (and /dev/stdout on a terminal refuses to).
  if (!in_place && ::fsync(fd) != 0) give_up("fsync of");
  if (::close(fd) != 0) {
    const int err = errno;
    if (!in_place) fs::remove(target, ec);
    fail_run("writing '{}' failed: {}", target, std::strerror(err));
  }
  if (in_place) return;
  fs::rename(target, path, ec);
  if (ec) {
    fs::remove(target, ec);
    fail_run("cannot rename '{}' to '{}': {}", target, path, ec.message());
  }
  // The rename itself on disk: fsync of the folder (best effort: some file systems refuse).
  const fs::path parent = fs::path(path).parent_path();
  const int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file(const std::string& path, std::string_view text) {
  write_file(path, {Chunk{text.data(), text.size()}});
}

long long free_bytes(const std::string& path) {
  std::error_code ec;
  fs::path p = path.empty() ? fs::path(".") : fs::path(path);
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  if (p.empty()) p = ".";
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return -1;
  return static_cast<long long>(st.f_bavail) * static_cast<long long>(st.f_frsize);
}

}  // namespace mt::io
