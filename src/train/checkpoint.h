// Distributed checkpoints (docs/checkpoints.md): every rank writes the part of the model it
// updates (its optimizer range [opt_lo, opt_hi) of its stage's tp-sharded flat buffer: the
// f32 master values, AdamW's m and v) as one safetensors file; world rank 0 writes
// index.json naming, for every global tensor, its global shape and which file holds which
// slice (a piece: tensor, tp rank of tp size, tp-local elements [lo, hi), byte offsets and
// CRC32C of its three arrays), and the trainer state. A checkpoint is written into
// DIR/step-N.tmp, fsynced, renamed to DIR/step-N when every rank has finished; then
// DIR/latest is replaced atomically and all but the newest --keep are removed.
//
// Loading into any layout: each rank computes the global element runs of every parameter
// slice it holds (for_each_tp_run) and reads them from the pieces that cover them (an
// interval lookup per tensor), verifying each piece's checksum.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace mt::comm {
class Group;
}

namespace mt::train {

struct Replica;
struct TrainOptions;

namespace ckpt {

// CRC32C (Castagnoli), hardware instruction where the CPU has SSE4.2.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

// The three arrays a piece holds, in file order.
inline constexpr int kArrays = 3;
inline constexpr const char* kArrayNames[kArrays] = {"master", "adam_m", "adam_v"};

struct Piece {
  std::string tensor;
  int file = 0;  // index into Index::files
  int tp_rank = 0, tp_size = 1;
  int ep_rank = 0, ep_size = 1;               // an expert tensor's ep slice (--ep)
  int64_t local_lo = 0, local_hi = 0;         // tp-local elements of the tensor
  int64_t offset_bytes[kArrays] = {0, 0, 0};  // absolute, in the file
  uint32_t crc[kArrays] = {0, 0, 0};
  int64_t elems() const { return local_hi - local_lo; }
};

struct TensorInfo {
  Shape shape;  // global (the saving layout's vocabulary padding)
  int64_t real_rows = -1;
  model::TpSplit tp_split = model::TpSplit::kReplicated;
  std::vector<int64_t> row_blocks;  // kBlockRows
};

struct FileInfo {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  int rank = 0;
};

// A parsed index.json.
struct Index {
  std::string dir;  // the checkpoint directory
  int64_t step = 0;
  int64_t adam_steps = 0;
  uint64_t seed = 0;
  int64_t batch = 0;             // the global batch it was trained with (0: not recorded)
  int64_t nonfinite_in_row = 0;  // non-finite steps skipped in a row up to `step`
  model::GptConfig config;
  std::string layout_text;  // "dp 2 cp 2 tp 2 pp 2 zero 1" (informative)
  // The saving layout. With context parallelism the optimizer ranges are those of the
  // dp x cp group (the cp ranks of a replica hold the same parameters and share its ZeRO
  // shards, docs/context_parallel.md); cp 1 for an index written before cp was recorded.
  int dp = 1, cp = 1, tp = 1, pp = 1, zero = 0;
  std::string json_text;  // the whole index, for inspect
  std::map<std::string, TensorInfo> tensors;
  std::vector<FileInfo> files;
  std::vector<Piece> pieces;
  int64_t data_bytes() const;
};

// Reads and checks DIR/index.json: format, the files named exist with their recorded sizes
// (a truncated file is named). A model given: refuses one whose tensors differ from it.
// Throws mt::Error (bad input) naming the file and what is wrong.
Index read_index(const std::string& dir, const model::GptConfig* expect = nullptr);

// The checkpoints in DIR (step-N directories with an index.json), newest first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// One slice of a parameter a rank loads: tp-local elements [lo, hi) of `spec` (tp_rank and
// tp_size in the spec), into dst[k] (element lo of array k; null: not wanted).
struct Target {
  const model::ParamSpec* spec = nullptr;
  int64_t lo = 0, hi = 0;
  float* dst[kArrays] = {nullptr, nullptr, nullptr};
};
// Reads the targets' elements from the checkpoint, checking each piece read against its
// checksum. Elements in vocabulary padding rows are set to 0. Throws mt::Error naming the
// file (damaged, missing) or the tensor (no piece covers it, another shape).
void load_targets(const Index& idx, const std::vector<Target>& targets);

// Every piece of every file read and checked; returns the problems found (empty: all OK).
std::vector<std::string> verify(const Index& idx);

// --- in the training loop (collective over `world`) ---------------------------------

// State a run keeps beside the model, saved into and restored from the same checkpoint
// directory by every rank for itself (no collectives): DiLoCo's outer state
// (train/outer_optimizer.h).
struct Extension {
  virtual ~Extension() = default;
  // Whether this rank's model goes into the checkpoint's pieces (false: another rank's
  // pieces stand for it, and the extension saves what differs).
  virtual bool saves_model() const = 0;
  virtual void save(const std::string& tmp_dir, int64_t step) = 0;  // before the index
  virtual void load(const std::string& dir, int64_t step) = 0;      // after the model
};

struct RankGroups {
  comm::Group& world;
  comm::Group& dp;
  comm::Group& tp;
  comm::Group& pp;
  Extension* extension = nullptr;
};

// Saves step `step` (steps done) into o.checkpoint_dir; every rank calls it. Refuses (a run
// failure, nothing written) when any rank's share holds a value that is not finite; a write
// that fails leaves no temporary file. `nonfinite_in_row`: the non-finite steps skipped in a
// row up to `step` (train/nonfinite.h), restored by resume.
void save(const TrainOptions& o, const RankGroups& g, Replica& rep, int64_t step, bool talk,
          int64_t nonfinite_in_row = 0);

// Restores the newest loadable checkpoint that o.resume names ("auto": the newest valid one
// in o.checkpoint_dir, or none; else a checkpoint directory, or a DIR holding them) into
// the replica. Returns the steps already done (0: from scratch). A damaged checkpoint is
// reported and, with "auto", the previous one tried. `nonfinite_in_row` (if given): the
// checkpoint's count of non-finite steps skipped in a row (0 from scratch).
int64_t resume(const TrainOptions& o, const RankGroups& g, Replica& rep, bool talk,
               int64_t* nonfinite_in_row = nullptr);

// Overwrites the rank's master values (its optimizer range; Adam's state is kept) with what
// `fill(spec, lo, hi, dst)` writes: tp-local elements [lo, hi) of parameter `spec` into dst.
// Every rank calls it (ZeRO-1/2 then all-gather the values over dp).
using MasterFill = std::function<void(const model::ParamSpec&, int64_t, int64_t, float*)>;
void load_master_values(Replica& rep, const MasterFill& fill);

// Test hook (env MESHTRAIN_FAULT, docs/checkpoints.md): at `point` of step `step` on world
// rank `rank`, kill this process (SIGKILL), throw a run failure, pause (sleep 3 s, then go
// on), or send this process SIGTERM, SIGINT or SIGUSR1 (term, int, usr1).
void maybe_fault(const char* point, int64_t step, int rank);

// --- offline (the CLI) ------------------------------------------------------------------

// The whole model's tensors (global, this checkpoint's padding) and optimizer state.
struct GlobalState {
  std::vector<model::ParamSpec> specs;              // tp = 1, whole model
  std::vector<std::vector<float>> arrays[kArrays];  // per spec
};
GlobalState load_global(const Index& idx);

// Refuses a layout in which this checkpoint could not be resumed: the checkpoint's batch is
// fixed (resume refuses another), so `target` is checked with it by TrainOptions::validate,
// as train would check it (--dp must divide the batch, and so on).
void check_resumable(const Index& idx, const TrainOptions& target);

// Writes `st` as a checkpoint of the layout in `o` (dp, cp, tp, pp, zero; its schedule) into
// out_dir (atomically, like save); check_resumable first. Returns the number of files written.
int write_resharded(const Index& idx, const GlobalState& st, const TrainOptions& o,
                    const std::string& out_dir);

}  // namespace ckpt
}  // namespace mt::train
