// Writes that cannot complete are errors (core/write_file.h, docs/checkpoints.md): metrics on
// a full disk (/dev/full) fail at the first step, not silently; an export or a checkpoint
// that cannot fit is refused before training; a write that fails mid-way leaves no .tmp; a
// device target is written in place, never replaced.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/write_file.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

const fs::path& dir() {
  static const fs::path d = scratch_dir("write-errors");
  return d;
}

const std::string& data() {
  static const std::string p = demo_tokens(dir());
  return p;
}

std::string run_flags() {
  return "train --model tiny --n-layer 2 --data " + data() +
         " --steps 3 --batch 8 --threads 1 --peak-gflops 100";
}

// Whether `unshare -m` can mount a small tmpfs here (root in a container that allows it):
// the full-disk tests run inside such a private mount, which vanishes with the command.
bool can_mount_tmpfs() {
  static const bool ok =
      run_command("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs /mnt'").exit_code == 0;
  return ok;
}

// `cmd` run with a fresh tmpfs of `size` mounted at `at` (made first).
RunResult with_tmpfs(const fs::path& at, const std::string& size, const std::string& cmd) {
  fs::create_directories(at);
  return run_command("unshare -m sh -c 'mount -t tmpfs -o size=" + size + " tmpfs " + at.string() +
                     " && " + cmd + "'");
}

TEST(WriteErrors, MetricsOnAFullDiskFailAtTheFirstStep) {
  const RunResult r = run_meshtrain(run_flags() + " --metrics /dev/full");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("writing the metrics file '/dev/full' failed: No space left on device"),
            std::string::npos)
      << r.output;
  // At once: step 1's row failed, so step 2 never ran.
  EXPECT_EQ(r.output.find("step     2/"), std::string::npos) << r.output;
}

TEST(WriteErrors, ADeviceIsWrittenInPlaceNeverReplaced) {
  // /dev/full stays the device, and no /dev/full.tmp appears: the export is written in
  // place (and fails there), never into a temporary file renamed over the device.
  ASSERT_TRUE(fs::is_character_file("/dev/full"));
  EXPECT_THROW(io::write_file("/dev/full", std::string(100, 'x')), Error);
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  EXPECT_FALSE(fs::exists("/dev/full.tmp"));
  try {
    io::write_file("/dev/full", "x");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kRunFailure);
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos);
  }
  // A regular file: complete, no temporary left.
  const fs::path f = dir() / "plain.txt";
  io::write_file(f.string(), "hello\n");
  std::ifstream in(f);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "hello");
  EXPECT_FALSE(fs::exists(f.string() + ".tmp"));
  // An unwritable place: bad input (exit 2), naming it.
  try {
    io::write_file("/nonexistent-folder/x.safetensors", "x");
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder/x.safetensors.tmp"),
              std::string::npos);
  }
}

// --export onto a disk too small for the weights: refused before the first step, exit 2,
// with the free space and the size needed; nothing written, no .tmp.
TEST(WriteErrors, ExportThatCannotFitIsRefusedBeforeTraining) {
  if (!can_mount_tmpfs()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root, unshare -m)";
  const fs::path at = dir() / "small";
  const RunResult r = with_tmpfs(at, "256k",
                                 std::string(MT_BINARY) + " " + run_flags() + " --export " +
                                     (at / "e.safetensors").string() +
                                     "; echo exit=$?; echo ==left==; ls -a " + at.string());
  EXPECT_NE(r.output.find("exit=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the disk there has 0.3 MB free, but the exported weights take at least"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step     1/"), std::string::npos) << r.output;
  const size_t left = r.output.find("==left==");
  ASSERT_NE(left, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("e.safetensors", left), std::string::npos) << r.output;
}

// A disk that fills up during the run: the first checkpoint fits, the second does not. The
// failure is an error at once (exit 1, the file and the reason named), no step-N.tmp is
// left, the first checkpoint and `latest` stay.
TEST(WriteErrors, CheckpointOnADiskThatFillsUpLeavesNoTmp) {
  if (!can_mount_tmpfs()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root, unshare -m)";
  const fs::path at = dir() / "fills";
  const fs::path c = at / "ck";
  // A checkpoint of the 2-layer tiny model is 4.9 MB (master, m, v of 0.41M parameters,
  // padded vocabulary included); 8 MB hold one and not two.
  const RunResult r =
      with_tmpfs(at, "8m",
                 std::string(MT_BINARY) + " " + run_flags() + " --checkpoint-dir " + c.string() +
                     " --checkpoint-every 1 --keep 0; echo exit=$?; echo ==left==; ls -a " +
                     c.string() + "; cat " + (c / "latest").string());
  EXPECT_NE(r.output.find("exit=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("saved checkpoint " + (c / "step-00000001").string()), std::string::npos)
      << r.output;
  const size_t at_left = r.output.find("==left==");
  ASSERT_NE(at_left, std::string::npos) << r.output;
  const std::string left = r.output.substr(at_left);
  EXPECT_EQ(left.find(".tmp"), std::string::npos) << left;
  EXPECT_EQ(left.find("step-00000002"), std::string::npos) << left;
  EXPECT_NE(left.find("\nstep-00000001\nstep-00000001\n"), std::string::npos)
      << left;  // the folder, then `latest`
}

}  // namespace
}  // namespace mt::test
