// `train --tensorboard DIR`: the event file read back by a reader written here from the
// format's description (record length, masked CRC-32C of length and data, the Event
// protobuf), independent of the writer: the same scalars, steps and tags as the metrics file.
#include "obs/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace mt {
namespace {

// Bit by bit (no table), reflected Castagnoli polynomial.
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(const std::string& s) {
  const uint32_t c = crc32c_bitwise(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;  // tag, simple_value
};

// A protobuf message's fields: (field number, wire type, varint value or bytes).
struct Field {
  int number = 0, wire = 0;
  uint64_t v = 0;
  std::string bytes;
};
std::vector<Field> fields(const std::string& m) {
  std::vector<Field> out;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (i >= m.size() || shift > 63) throw std::runtime_error("truncated varint");
      const auto b = static_cast<unsigned char>(m[i++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < m.size()) {
    Field f;
    const uint64_t k = varint();
    f.number = static_cast<int>(k >> 3);
    f.wire = static_cast<int>(k & 7);
    if (f.wire == 0) {
      f.v = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      if (i + n > m.size()) throw std::runtime_error("truncated fixed field");
      f.bytes = m.substr(i, n);
      i += n;
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      if (i + n > m.size()) throw std::runtime_error("truncated bytes field");
      f.bytes = m.substr(i, n);
      i += n;
    } else {
      throw std::runtime_error("wire type " + std::to_string(f.wire));
    }
    out.push_back(f);
  }
  return out;
}

Event parse_event(const std::string& data) {
  Event e;
  for (const Field& f : fields(data)) {
    if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, f.bytes.data(), 8);
    if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.v);
    if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    if (f.number == 5 && f.wire == 2)
      for (const Field& value : fields(f.bytes))  // Summary.value
        if (value.number == 1 && value.wire == 2) {
          std::string tag;
          float simple = 0;
          bool has_simple = false;
          for (const Field& g : fields(value.bytes)) {
            if (g.number == 1 && g.wire == 2) tag = g.bytes;
            if (g.number == 2 && g.wire == 5) {
              std::memcpy(&simple, g.bytes.data(), 4);
              has_simple = true;
            }
          }
          // TensorBoard takes a value whose oneof holds nothing for no scalar: a 0 must be
          // written (proto3 leaves a plain float field out when it is 0).
          if (!has_simple)
            throw std::runtime_error("Summary.Value '" + tag + "' without simple_value");
          e.values.emplace_back(tag, simple);
        }
  }
  return e;
}

// Every record of an event file, each CRC checked (throws naming the record that fails).
std::vector<Event> read_events(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> out;
  size_t i = 0;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, s.data() + at, 4);
    return v;
  };
  while (i < s.size()) {
    if (i + 12 > s.size()) throw std::runtime_error("truncated record header");
    const std::string len_bytes = s.substr(i, 8);
    uint64_t n;
    std::memcpy(&n, len_bytes.data(), 8);
    if (u32(i + 8) != masked(len_bytes))
      throw std::runtime_error("length CRC of record " + std::to_string(out.size()));
    if (i + 12 + n + 4 > s.size()) throw std::runtime_error("truncated record");
    const std::string data = s.substr(i + 12, n);
    if (u32(i + 12 + n) != masked(data))
      throw std::runtime_error("data CRC of record " + std::to_string(out.size()));
    out.push_back(parse_event(data));
    i += 12 + n + 4;
  }
  return out;
}

TEST(TensorBoard, Crc32cOfTheStandardCheckString) {
  // CRC-32C's check value (RFC 3720 B.4; the "check" of the Castagnoli CRC catalogue).
  EXPECT_EQ(obs::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise("123456789"), 0xE3069283u);
}

class TensorBoardRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::scratch_dir("tensorboard"));
    const std::string data = test::demo_tokens(*dir_);
    const test::RunResult r = test::run_meshtrain(
        "train --model tiny --n-layer 2 --seq 32 --batch 4 --threads 1 --steps 6 --eval-every 3 "
        "--peak-gflops 250 --data " +
        data + " --metrics " + (*dir_ / "m.jsonl").string() + " --tensorboard " +
        (*dir_ / "tb").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& e : std::filesystem::directory_iterator(*dir_ / "tb"))
      files_.push_back(e.path().string());
  }
  static std::filesystem::path* dir_;
  static std::vector<std::string> files_;
};
std::filesystem::path* TensorBoardRun::dir_ = nullptr;
std::vector<std::string> TensorBoardRun::files_;

TEST_F(TensorBoardRun, EventsAreTheMetricsScalars) {
  ASSERT_EQ(files_.size(), 1u);
  EXPECT_NE(files_[0].find("events.out.tfevents."), std::string::npos) << files_[0];
  const std::vector<Event> events = read_events(files_[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.7e9);  // seconds since 1970: after 2023
  std::map<std::pair<std::string, int64_t>, float> got;
  for (size_t k = 1; k < events.size(); ++k)
    for (const auto& [tag, v] : events[k].values) got[{tag, events[k].step}] = v;
  std::ifstream in(*dir_ / "m.jsonl");
  std::string line;
  int64_t compared = 0;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    const int64_t step = row["step"];
    for (const char* key : {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu",
                            "peak_bytes", "time_s", "dp_bytes", "tp_bytes", "pp_bytes"}) {
      if (!row.contains(key)) continue;
      const auto it = got.find({key, step});
      ASSERT_NE(it, got.end()) << key << " at step " << step;
      // simple_value is a float: the metrics' double rounded once.
      EXPECT_EQ(it->second, static_cast<float>(row[key].get<double>())) << key << " " << step;
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int64_t>(got.size()));  // nothing the metrics lack
  EXPECT_EQ(compared, 6 * 10 + 2);  // 10 scalars per step, val_loss at steps 3 and 6
}

TEST_F(TensorBoardRun, ReaderCatchesACorruptedByte) {
  ASSERT_EQ(files_.size(), 1u);
  const std::string copy = (*dir_ / "corrupt.tfevents").string();
  std::filesystem::copy_file(files_[0], copy, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);  // inside the second record's data
    f.put('\x7f');
  }
  EXPECT_THROW(read_events(copy), std::runtime_error);
}

TEST(TensorBoard, RefusesAFileForTheFolder) {
  const auto dir = test::scratch_dir("tensorboard-refuse");
  std::ofstream(dir / "file") << "x";
  const test::RunResult r =
      test::run_meshtrain("train --model tiny --steps 1 --data " + test::demo_tokens(dir) +
                          " --tensorboard " + (dir / "file").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensorboard"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt
