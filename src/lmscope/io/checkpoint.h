// Training checkpoints (train --checkpoint-dir, --resume): one directory per saved step,
// DIR/step-00000100/, holding
//   model.safetensors      the weights by their PyTorch names (what --init and PyTorch load)
//   optimizer.safetensors  AdamW's moments, "<name>.exp_avg" and "<name>.exp_avg_sq" (PyTorch's names)
//   state.json             the step, AdamW's step count, where sampling stands, the run's
//                          configuration, whether the weights are finite, each file's size and
//                          CRC-32, and its own CRC-32 (of the rest of it, written compactly)
// Each file is written durably (durable_file.h) into DIR/.partial-step-00000100/, which is then
// renamed into place and DIR flushed: a checkpoint is there whole or not at all, whenever the
// process dies. A reader takes the newest one whose state.json matches its CRC-32 and its directory's
// step and whose files match state.json, naming any newer one it had to pass over (a file that cannot
// be read included).
#pragma once

#include "lmscope/io/token_data.h"
#include "lmscope/model/loss_scaler.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lmscope {

class AdamW;
class Transformer;

struct CheckpointState {
  std::int64_t step = 0;         // optimizer steps completed
  std::int64_t adamw_steps = 0;  // AdamW's t (bias correction)
  BatchSampler::Position sampler;
  nlohmann::ordered_json config;  // the run's configuration, as train writes it
  // fp16's loss scale and its counts of good and of skipped steps, where the optimizer scales
  std::optional<LossScaler::State> loss_scaler;
  // Whether every weight is finite: set by write_checkpoint as it writes them (true in a checkpoint
  // that does not say, written before it was recorded).
  bool weights_finite = true;
};

// Writes the checkpoint of state.step into dir (made if missing), then removes all but the newest
// `keep` (0 keeps all) and any partial one a dead run left; when none of those `keep` holds finite
// weights, the newest checkpoint that does is kept as well. Returns the checkpoint's path. One rank
// writes; with a sharded AdamW (ZeRO-1) the moments are assembled from every rank's pieces as they
// are written, so every other rank calls join_checkpoint_write meanwhile (it does nothing otherwise).
std::string write_checkpoint(const std::string& dir, Transformer& model, AdamW& opt, const CheckpointState& state,
                             int keep);
void join_checkpoint_write(Transformer& model, AdamW& opt);

struct FoundCheckpoint {
  std::string path;
  CheckpointState state;
  std::vector<std::string> passed_over;  // newer ones, each "path: why it is not complete"
  std::vector<std::string> notes;        // of the one found, e.g. a state.json without its CRC-32
  // What to warn of: each passed over ("passed over 'path': why"), then the notes.
  std::vector<std::string> warnings() const;
};

// The newest complete checkpoint in dir. UserError when dir is missing or holds none complete.
FoundCheckpoint find_checkpoint(const std::string& dir);

// The checkpoints (step-* directories, complete or not) in dir, newest first; none when dir is not
// there.
std::vector<std::string> checkpoint_paths(const std::string& dir);
// Removes every checkpoint in dir and every partial one, nothing else (train --overwrite).
void remove_checkpoints(const std::string& dir);

// The weights and AdamW's moments and step count of a found checkpoint, into a model and optimizer
// of its shape (UserError naming the first tensor that differs); a sharded AdamW takes its pieces.
// The file holds whole moments either way, as an unsharded run writes them.
void load_checkpoint(const FoundCheckpoint& c, Transformer& model, AdamW& opt);

}  // namespace lmscope
