#include "train/output_paths.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/write_file.h"

namespace mt::train {

namespace fs = std::filesystem;

void check_output_file(const std::string& path, const char* flag) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail("{} '{}' is a folder: name a file in it, e.g. {}/out", flag, path, path);
  // An existing file (or /dev/null, /dev/stdout) is written in place: it, not its folder,
  // must be writable.
  if (fs::exists(path, ec)) {
    if (::access(path.c_str(), W_OK) != 0)
      fail("{} '{}' exists and is not writable (choose a path you can write)", flag, path);
    return;
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(folder, ec))
    fail("{} '{}': the folder '{}' does not exist (create it first, e.g. mkdir -p {})", flag, path,
         folder, folder);
  if (::access(folder.c_str(), W_OK) != 0)
    fail("{} '{}': the folder '{}' is not writable (choose a path you can write)", flag, path,
         folder);
}

void check_output_dir(const std::string& dir, const char* flag) {
  if (dir.empty()) return;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail("{} '{}' exists and is not a folder (remove it or choose another path)", flag, dir);
  fs::create_directories(dir, ec);
  if (ec) fail("{} '{}': cannot create the folder: {}", flag, dir, ec.message());
  if (::access(dir.c_str(), W_OK) != 0)
    fail("{} '{}' is not writable (choose a folder you can write)", flag, dir);
}

void check_free_space(const std::string& path, double bytes, const char* flag, const char* what) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec) && !fs::is_directory(path, ec)) return;
  const long long free = io::free_bytes(path);
  if (free >= 0 && static_cast<double>(free) < bytes)
    fail(
        "{} '{}': the disk there has {:.1f} MB free, but {} take at least {:.1f} MB (free "
        "space, or choose a folder on another disk)",
        flag, path, static_cast<double>(free) / 1e6, what, bytes / 1e6);
}

void check_export_folder(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    // Only a folder meshtrain made (or an empty one) is written into: nothing else in it is
    // overwritten.
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name != "model.safetensors" && name != "config.json")
        fail(
            "--export '{}' is a folder that holds other files ('{}'): name a new folder (it "
            "gets model.safetensors and config.json) or a file ending in .safetensors",
            dir, name);
    }
  }
  check_output_dir(dir, "--export");
}

}  // namespace mt::train
