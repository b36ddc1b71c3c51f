// train_gpt on a pipeline (docs/pipeline.md, "train_gpt on a pipeline"): the layout of a job from
// its three sources, and the training loop on dscpp's PipelineEngine.
//
// The pipeline degree comes from the model config's `parallelism.pipeline_model_parallel_size`,
// the ds_config's `pipeline.stages` (a number) or --pipeline-model-parallel-size; those given
// must agree (an error names each). The data-parallel degree is what remains of the world
// (ParallelismConfig::resolve). The tensor-parallel degree is the model config's
// `parallelism.tensor_model_parallel_size` or --tensor-model-parallel-size; with t > 1 the
// ranks form DeepSpeed's pipe x data x model topology (model fastest) and the GPT is
// model_zoo::tensor_parallel_gpt_layer_specs with tensor_parallel_gpt_loss.
//
// On a pipeline the GPT is its LayerSpecs (model_zoo::gpt_layer_specs: the embedding and the
// tied output head one TiedLayerSpec, the loss model_zoo::gpt_loss as loss_fn), each layer
// seeded with --seed + its index, so that its initial weights do not depend on the layout:
// one rank with --seed-layers starts from the same weights. An MoE GPT
// (parallelism.expert_model_parallel_size E dividing the data degree) builds its MoE blocks on
// expert-parallel groups that split each stage's data group (comm::new_expert_groups on the
// pipe x data topology; with a tensor degree, each stage and tensor rank's data group on the
// pipe x data x model topology, the MoE blocks tensor_parallel_gpt_layer_specs'); the engine
// reduces the experts over the expert-data group; the log
// adds the aux loss and load balance of every stage's MoE layers, and the expert biases move
// after each batch. --save / --save-interval / --load are train_gpt's (PipelineEngine's
// checkpoints in DeepSpeed's pipeline layout; the data position follows the restored step).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/nn/layer_spec.h"
#include "gpt_flags.h"

namespace dscpp::examples {

struct JobLayout {
  int64_t pipeline = 1;  // stages
  int64_t data = 1;      // data-parallel ranks per stage
  int64_t tensor = 1;    // tensor-parallel ranks per stage and data index
  int64_t sequence = 1;  // DeepSpeed-Ulysses' ranks per sequence (consecutive ranks)
  std::string source;    // where the pipeline degree came from (for the start-up line)
};

// The job's layout for `world` ranks, from the model config, the ds_config as read (before the
// flags fill it) and the command line. Throws FlagError for disagreeing sources, ConfigError
// for a world the degrees do not divide.
JobLayout job_layout(const model_zoo::GPTConfig& cfg, const nlohmann::json& ds_config,
                     const GptOptions& args, int64_t world);

// specs with each one's build preceded by at::manual_seed(base_seed + its index), as
// DeepSpeed's PipelineModule(seed_layers=True) builds them.
std::vector<nn::LayerSpec> seeded_layer_specs(std::vector<nn::LayerSpec> specs, int64_t base_seed);

// Trains on a PipelineEngine of layout.pipeline stages; rank 0 logs train_gpt's lines plus the
// bubble (the mean over ranks of PipelineEngine::last_bubble_fraction of the step logged).
// Returns the exit status.
int train_gpt_pipeline(const GptOptions& args, const model_zoo::GPTConfig& cfg,
                       const nlohmann::json& ds_config, const JobLayout& layout);

}  // namespace dscpp::examples
