// DeepSpeed's checkpoint layout: see ds_layout.h.
#include "dscpp/runtime/checkpoint/ds_layout.h"

#include <filesystem>
#include <fstream>

#include "dscpp/runtime/checkpoint/atomic_file.h"

namespace dscpp::checkpoint {

namespace fs = std::filesystem;

std::string tag_dir(const std::string& dir, const std::string& tag) {
  return (fs::path(dir) / tag).string();
}

std::string model_states_path(const std::string& dir, const std::string& tag) {
  return (fs::path(dir) / tag / "mp_rank_00_model_states.pt").string();
}

std::string zero_model_states_path(const std::string& dir, const std::string& tag, int dp_rank) {
  return (fs::path(dir) / tag /
          ("zero_pp_rank_" + std::to_string(dp_rank) + "_mp_rank_00_model_states.pt"))
      .string();
}

std::string zero_states_path(const std::string& dir, const std::string& tag, int dp_rank,
                             bool bf16) {
  return (fs::path(dir) / tag /
          ((bf16 ? "bf16_" : "") + std::string("zero_pp_rank_") + std::to_string(dp_rank) +
           "_mp_rank_00_optim_states.pt"))
      .string();
}

std::string find_zero_states(const std::string& dir, const std::string& tag, int dp_rank) {
  for (bool bf16 : {false, true}) {
    std::string p = zero_states_path(dir, tag, dp_rank, bf16);
    if (fs::is_regular_file(p)) return p;
  }
  throw CheckpointError("checkpoint '" + tag_dir(dir, tag) +
                        "' has no ZeRO partition file of rank " + std::to_string(dp_rank) +
                        " (expected " + zero_states_path(dir, tag, dp_rank, false) +
                        " or its bf16_ variant)");
}

std::optional<std::string> read_latest(const std::string& dir, const std::string& file) {
  fs::path p = fs::path(dir) / file;
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  if (!fs::is_regular_file(p, ec)) throw CheckpointError("'" + p.string() + "' is not a file");
  // A tag is a folder name: a `latest` longer than any is not one (and is not read whole).
  constexpr size_t kMaxLatest = 4096;
  std::ifstream in(p, std::ios::binary);
  std::string text(kMaxLatest + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw CheckpointError("cannot read '" + p.string() + "'");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxLatest)
    throw CheckpointError("'" + p.string() + "' is longer than " + std::to_string(kMaxLatest) +
                          " bytes: it should name a tag");
  // DeepSpeed strips the whitespace around the tag (fd.read().strip()).
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    throw CheckpointError("'" + p.string() + "' is empty: it should name a tag");
  std::string tag = text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
  for (size_t i = 0; i < tag.size(); ++i) {
    const auto c = static_cast<unsigned char>(tag[i]);
    if (c < 0x20 || c == 0x7f)
      throw CheckpointError("'" + p.string() + "' holds a control character (byte " +
                            std::to_string(first + i) + "): it should name a tag");
  }
  return tag;
}

void write_latest(const std::string& dir, const std::string& tag, const std::string& file) {
  AtomicFile out((fs::path(dir) / file).string());
  out.write(tag.data(), tag.size());  // DeepSpeed writes the bare tag, no newline
  out.commit();
}

void make_tag_dir(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / tag, ec);
  // Another rank may have created it between the check and the mkdir.
  if (ec && !fs::is_directory(fs::path(dir) / tag)) {
    throw CheckpointError("cannot create checkpoint folder '" + tag_dir(dir, tag) +
                          "': " + ec.message());
  }
}

std::string resolve_model_states(const std::string& dir, std::string& tag) {
  if (tag.empty()) {
    auto latest = read_latest(dir);
    if (!latest) throw CheckpointError("'" + dir + "' has no 'latest' file: pass a tag");
    tag = *latest;
  }
  check_tag(tag);
  const std::string path = model_states_path(dir, tag);
  if (!std::filesystem::exists(path) &&
      std::filesystem::exists(zero_model_states_path(dir, tag, 0)))
    return zero_model_states_path(dir, tag, 0);
  return path;
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos) {
    throw CheckpointError("checkpoint tag '" + tag +
                          "' is not a folder name (empty, '.', '..' or holding '/')");
  }
}

const std::vector<std::string>& engine_state_keys() {
  static const std::vector<std::string> keys = {"module",
                                                "buffer_names",
                                                "optimizer",
                                                "param_shapes",
                                                "frozen_param_shapes",
                                                "shared_params",
                                                "frozen_param_fragments",
                                                "lr_scheduler",
                                                "data_sampler",
                                                "random_ltd",
                                                "sparse_tensor_module_names",
                                                "skipped_steps",
                                                "global_steps",
                                                "global_samples",
                                                "dp_world_size",
                                                "mp_world_size",
                                                "checkpoint_parallel_dimensions",
                                                "ds_config",
                                                "ds_version",
                                                "dscpp_version",
                                                "dscpp_zero_stage",
                                                "dscpp_tensor_parallel",
                                                "dscpp_loss_scaler",
                                                "dscpp_rng_states",
                                                "dscpp_micro_steps",
                                                "dscpp_layout_orders",
                                                "dscpp_save_id",
                                                "dscpp_rank",
                                                "dscpp_world_size",
                                                "dscpp_global_steps",
                                                "universal_checkpoint_info",
                                                "dscpp_pipe",
                                                "num_experts",
                                                "ds_autoep_layers",
                                                "dscpp_moe"};
  return keys;
}

}  // namespace dscpp::checkpoint
