// train_gpt's command line: today's flags, Megatron-LM's and DeepSpeed's spellings beside them
// (a Megatron or DeepSpeed user's command line runs unchanged), read by one parser, and the flags'
// values carried into the ds_config's "auto" entries the way Hugging Face's DeepSpeed integration
// fills them (fill_match): a flag fills an "auto", agrees with a number written there, or is an
// error naming both.
//
// No prefix guessing: `--train-it` is unknown, `--deepspeed x` is not `--deepspeed_config x`.
// Everything here is pure (no process group, no files but the ones named), so a program that
// reads the struct (the pipeline path of train_gpt) needs nothing else.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace dscpp::examples {

// A command line that cannot be run: printed once (by rank 0), exit status 2.
class FlagError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The parsed command line. Optional fields are unset when the flag was not given, so that only
// flags the user wrote are checked against the ds_config.
struct GptOptions {
  std::string model_config;        // --model-config
  std::string data_path;           // --data-path / --train-data-path: indexed dataset prefix
  std::string ds_config;           // --deepspeed_config / --deepspeed-config
  std::string save, load;          // --save / --load: checkpoint folders (empty: none)
  int64_t train_iters = 100;       // --train-iters: optimizer steps in all
  bool train_iters_given = false;  // --train-iters was on the command line
  int64_t save_interval = 0;       // --save-interval (0: only at the end)
  int64_t log_interval = 10;       // --log-interval
  int64_t seed = 1234;             // --seed: initialisation and data order
  std::optional<int64_t> micro_batch_size;    // --micro-batch-size
  std::optional<int64_t> global_batch_size;   // --global-batch-size
  std::optional<double> lr, min_lr;           // --lr, --min-lr
  std::optional<int64_t> lr_warmup_iters;     // --lr-warmup-iters
  std::optional<int64_t> lr_decay_iters;      // --lr-decay-iters
  std::optional<std::string> lr_decay_style;  // --lr-decay-style: constant, linear, cosine
  std::optional<double> weight_decay;         // --weight-decay
  std::optional<double> adam_beta1, adam_beta2, adam_eps;  // --adam-beta1/-beta2/-eps
  std::optional<double> clip_grad;                         // --clip-grad
  bool fp16 = false, bf16 = false;                         // --fp16 / --bf16
  bool deepspeed = false;                        // --deepspeed (Megatron-DeepSpeed's switch; no-op)
  int64_t tensor_model_parallel_size = 1;        // --tensor-model-parallel-size
  int64_t pipeline_model_parallel_size = 1;      // --pipeline-model-parallel-size
  std::optional<std::string> pipeline_schedule;  // --pipeline-schedule (pipeline.schedule)
  bool sequence_parallel = false;                // --sequence-parallel (Megatron's)
  // --check-for-nan-in-loss-and-grad (on) / --no-check-for-nan-in-loss-and-grad: stop at the
  // first step with a non-finite loss or gradient norm, or report it and train on (Megatron's).
  bool check_for_nan_in_loss_and_grad = true;
  // train_gpt's own.
  std::string on_save_error = "stop";  // --on-save-error: stop | continue (train_gpt_checkpoint.h)
  double peak_tflops = 0;
  int64_t profile_step = 0;  // 0: no profiling
  int64_t profile_steps = 1;
  std::string profile_out = "train_gpt_trace.json";
  bool profile_all_ranks = false;
  std::string memory_snapshot;  // empty: none
  int64_t memory_snapshot_step = 2;
  bool layer_specs = false;            // the GPT as LayerSpecs at any stage (always at stage 3)
  bool bench_no_comm = false;          // a no-op process group: the communication-off bound
  std::string grouped_wgrad = "auto";  // checked by ops::parse_grouped_weight_grad_mode
  bool seed_layers = false;  // each layer seeded with seed + its index (always on a pipeline)
  bool dry_run = false;      // --dry-run: the figures of examples/dry_run.h, no training
  bool help = false;         // --help: `help_text` holds the flags' descriptions
  std::string help_text;
};

// Parses argv (argv[0] is the program). Throws FlagError naming the flag: unknown, a prefix of
// a known one, a value of the wrong type, a duplicate, a value out of range, two spellings of
// one flag with different values, a required flag missing (not with --help).
GptOptions parse_gpt_flags(int argc, const char* const* argv);

// The ds_config with the flags applied, for a data-parallel world of `world_size` ranks:
// fills the "auto" entries the flags map to (and the batch size among train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps that the other two
// determine), adds the sections a flag asks for where the config has none (fp16, bf16, an
// AdamW for --lr, a schedule for --lr-decay-style...), and throws FlagError listing every
// number in the config that a flag contradicts ("ds_config X=a vs --flag=b"), and every
// "auto" that the program needs resolved and no flag gave.
nlohmann::json apply_gpt_flags(nlohmann::json ds_config, const GptOptions& options,
                               int64_t world_size);

// Throws FlagError when the ds_config (the flags applied) names no optimizer: train_gpt has no
// client optimizer to give the engine, so the way out is --lr or an "optimizer" section.
void require_optimizer(const nlohmann::json& ds_config);

}  // namespace dscpp::examples
