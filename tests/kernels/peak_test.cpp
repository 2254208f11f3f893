#include "kernels/peak.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace mt::kernels {
namespace {

// A private cache directory for the process.
class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("mt_peak_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(PeakCache, StoredValueIsReturnedAndWrittenToTheFile) {
  EXPECT_EQ(peak_cache_path(), (dir_ / "meshtrain" / "peak.json").string());
  store_peak_flops(DType::kBF16, 97, 1.5e12);
  EXPECT_EQ(peak_flops(DType::kBF16, 97), 1.5e12);  // no measurement: the stored value
  std::ifstream in(peak_cache_path());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"bf16\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"97\""), std::string::npos) << text;
}

TEST_F(PeakCache, AStoredPeakIsNeverLowered) {
  EXPECT_EQ(store_peak_flops(DType::kF32, 95, 3e11), 3e11);
  EXPECT_EQ(store_peak_flops(DType::kF32, 95, 1e11), 3e11);  // measured on a busy host
  EXPECT_EQ(peak_flops(DType::kF32, 95), 3e11);
  EXPECT_EQ(store_peak_flops(DType::kF32, 95, 4e11), 4e11);
}

TEST_F(PeakCache, ReadsAValueAnotherProcessCached) {
  std::filesystem::create_directories(dir_ / "meshtrain");
  std::ofstream(dir_ / "meshtrain" / "peak.json")
      << R"({"cpu": ")" << cpu_identity() << R"(", "f32": {"93": 2.5e11}})";
  EXPECT_EQ(peak_flops(DType::kF32, 93), 2.5e11);
}

// A cache written on another CPU (the same $HOME on a faster or slower host) would put the
// wrong denominator under MFU: its values are dropped, so a lower measurement here is kept
// rather than raised to the other CPU's peak.
TEST_F(PeakCache, IgnoresACacheMeasuredOnAnotherCpu) {
  std::filesystem::create_directories(dir_ / "meshtrain");
  std::ofstream(dir_ / "meshtrain" / "peak.json")
      << R"({"cpu": "Some Other CPU / 6 / 143 / 8", "f32": {"91": 2.5e11}})";
  EXPECT_EQ(store_peak_flops(DType::kF32, 91, 1e11), 1e11);
  std::ifstream in(peak_cache_path());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(cpu_identity()), std::string::npos) << text;
  EXPECT_EQ(text.find("Some Other CPU"), std::string::npos) << text;
}

TEST(Peak, TimedGemmIsPositive) {
  double t = 0;
  const double f = time_gemm_flops(DType::kF32, false, true, 64, 48, 32, 1, &t);
  EXPECT_GT(f, 0);
  EXPECT_GT(t, 0);
  EXPECT_GT(time_gemm_flops(DType::kBF16, true, false, 64, 48, 32, 1), 0);
}

}  // namespace
}  // namespace mt::kernels
