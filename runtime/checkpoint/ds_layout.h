// DeepSpeed's checkpoint directory layout (deepspeed/runtime/engine.py):
//   <dir>/latest                                         the last complete tag, one line
//   <dir>/<tag>/mp_rank_00_model_states.pt               module weights, counters, schedule
//   <dir>/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   rank r's ZeRO partition
// and the keys inside them that both DeepSpeed and dscpp read. Errors are CheckpointError,
// naming the directory or file and what is wrong with it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {

// The version of DeepSpeed whose format we write ("ds_version"; DeepSpeed parses it).
inline constexpr const char* kDsFormatVersion = "0.19.8";

std::string tag_dir(const std::string& dir, const std::string& tag);
std::string model_states_path(const std::string& dir, const std::string& tag);
// Stage 3's per-rank model states: <dir>/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt.
std::string zero_model_states_path(const std::string& dir, const std::string& tag, int dp_rank);
std::string zero_states_path(const std::string& dir, const std::string& tag, int dp_rank,
                             bool bf16);
// The zero file of dp_rank, whichever prefix it was written with; throws if neither exists.
std::string find_zero_states(const std::string& dir, const std::string& tag, int dp_rank);

// The tag <dir>/latest names, or nullopt when there is no such file. `file`: another pointer
// file of the same kind (DeepSpeed's universal checkpoints use "latest_universal").
std::optional<std::string> read_latest(const std::string& dir, const std::string& file = "latest");
// Writes <dir>/<file> atomically (temporary file, fsync, rename).
void write_latest(const std::string& dir, const std::string& tag,
                  const std::string& file = "latest");
// Creates <dir>/<tag>/ (and <dir>); safe when several processes race to create it.
void make_tag_dir(const std::string& dir, const std::string& tag);
// A tag must name one folder: not empty, no '/', not "." or "..".
void check_tag(const std::string& tag);

// The model-states file a reader of a whole checkpoint opens: the tag ("" means the one
// <dir>/latest names, which must exist; returned through `tag`) and its mp_rank_00 file, or
// at stage 3, which writes one per rank instead, rank 0's. The file may still be missing.
std::string resolve_model_states(const std::string& dir, std::string& tag);

// Keys of the model-states file that are DeepSpeed's or ours, never the client's.
const std::vector<std::string>& engine_state_keys();

}  // namespace dscpp::checkpoint
