// The parts of checkpoints that the save (checkpoint.cpp), the reads (checkpoint_read.cpp)
// and the offline rewrites (checkpoint_offline.cpp) share: the file helpers, the shard
// writer, the index's entries and the publication of a save (checkpoint_format.cpp). For
// those files only; the interface is train/checkpoint.h.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint.h"

namespace mt::train::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A checkpoint's folder name: step-00000042.
std::string step_name(int64_t step);

// Reads exactly `bytes` at `offset`; false when the file ends first.
bool read_at(int fd, void* data, int64_t bytes, int64_t offset);

// Reads exactly `bytes` at `offset` and returns their CRC32C in `crc`; false when the file
// ends first. In 4 MiB chunks, each checksummed right after its read (still in the cache),
// with the kernel asked to fetch the next 16 MiB meanwhile (POSIX_FADV_WILLNEED): the disk
// keeps reading while the CPU checksums and copies, where reading a whole piece and then
// checksumming it left the disk idle for the checksum (the 1-rank load was 68% of dd's rate).
bool read_checked(int fd, void* data, int64_t bytes, int64_t offset, uint32_t& crc);

// A small file written atomically: temporary name, fsync, rename, fsync of the directory;
// a failed write leaves no temporary file (io::write_file).
void write_small_atomic(const fs::path& path, const std::string& text);

// A tensor's tp split as the index names it, and back (`where` names the index in an error).
const char* split_name(model::TpSplit s);
model::TpSplit parse_split(const std::string& s, const std::string& where);

// The model in one line (messages that compare a checkpoint's model with the run's), and
// whether two configurations describe the same model.
std::string config_text(const model::GptConfig& c);
bool same_model(const model::GptConfig& a, const model::GptConfig& b);

// The model's tensors as the saving layout sees them globally (its vocabulary padding).
std::vector<model::ParamSpec> global_specs(model::GptConfig c, int tp);

// A piece to write: its index entry and where its three arrays are in memory.
struct PieceData {
  Piece meta;
  const float* src[kArrays] = {nullptr, nullptr, nullptr};
};

// Writes the pieces as a safetensors file (tensors "master/NAME/LO", "adam_m/...",
// "adam_v/...", 1-D F32), all masters first, then m, then v, in piece order; fills each
// piece's offsets and checksums. fsyncs; returns the file's bytes.
int64_t write_shard(const fs::path& path, std::vector<PieceData>& pieces,
                    const std::map<std::string, std::string>& metadata);

// A piece's entry in the index.
json piece_json(const Piece& p);

// A piece's slice of its tensor as a spec: the tensor's global spec split as the saving
// rank held it (tp, then ep for an expert tensor).
model::ParamSpec piece_spec(const Piece& pc, const TensorInfo& ti);

// The index of a checkpoint: trainer state, model, layout, tensors, files and pieces.
json make_index(int64_t step, const json& trainer, const model::GptConfig& config,
                const json& layout, int tp, const std::vector<FileInfo>& files,
                const std::vector<Piece>& pieces);

// Moves a finished temporary directory into place, then `latest`, then prunes to `keep`.
// `forward_only`: `latest` is not moved back to an older step than the one it names (an
// offline write beside a newer checkpoint).
void publish(const fs::path& dir, const fs::path& tmp, const std::string& name, int keep,
             int64_t step, int rank, bool forward_only = false);

// The saving run's layout as the index records it.
json layout_json(const TrainOptions& o);

// fn(k) for the three arrays at once, on threads of their own; the first error rethrown.
template <typename Fn>
void for_each_array(Fn fn) {
  std::exception_ptr err[kArrays];
  std::vector<std::thread> threads;
  for (int k = 0; k < kArrays; ++k)
    threads.emplace_back([&, k] {
      try {
        fn(k);
      } catch (...) {
        err[k] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace mt::train::ckpt
