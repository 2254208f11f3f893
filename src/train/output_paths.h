// Checks, before a run does any work, that the files and folders it will write at the end
// (or at its first checkpoint) can be written: a run must not train for hours and then lose
// its result to a typo in a path.
#pragma once

#include <string>

namespace mt::train {

// `path` names a file that can be created or replaced: its folder exists and is writable,
// and `path` itself is not a folder. `flag` names the option in the error.
void check_output_file(const std::string& path, const char* flag);

// `dir` is a writable folder, made (with its parents) if it does not exist.
void check_output_dir(const std::string& dir, const char* flag);
// The file system that will hold `path` has at least `bytes` free (a lower bound of what the
// run writes there: a run is refused only when it surely cannot write its result). A device
// or a pipe (/dev/null) is not checked. `flag` and `what` name them in the error.
void check_free_space(const std::string& path, double bytes, const char* flag, const char* what);

// --export DIR: a new or empty folder, or one that holds only a previous export
// (model.safetensors, config.json); made when missing.
void check_export_folder(const std::string& dir);

}  // namespace mt::train
