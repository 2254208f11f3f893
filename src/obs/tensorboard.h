// TensorBoard event files (`train --tensorboard DIR`), so that `tensorboard --logdir DIR`
// shows a run's scalars. The format TensorFlow's reader expects: a file named
// events.out.tfevents.<seconds>.<host>, a sequence of records
//   uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// (little-endian), each `data` one serialized tensorflow.Event protobuf: the first
// {wall_time, file_version "brain.Event:2"}, then one per scalar {wall_time, step,
// summary {value {tag, simple_value}}}, serialised by libprotobuf-lite from the messages of
// tensorboard_event.proto (TensorFlow's field numbers; protoc runs at build time).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace mt::obs {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), and TensorFlow's masking of it:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // "" = off. Makes `dir` (and its parents) and a new event file in it; refuses a folder it
  // cannot write (mt::Error).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  bool on() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // One scalar event (a float, as TensorBoard's simple_value is).
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();

 private:
  void record(const std::string& data);
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace mt::obs
