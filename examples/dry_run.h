// train_gpt --dry-run: what a GPT config and its layout cost per GPU, from the shape alone (no
// model is allocated, no process group is made), so that the seed's 535B layout can be checked
// on a laptop.
//
// - Parameters: GPTConfig::num_parameters(). Per GPU before ZeRO, Psi = N / (t * p): the ZeRO
//   paper's model-parallel split (each rank holds 1/(t p) of the layers' weights; the
//   embedding's copies on the first and last stage and the replicated LayerNorms are within
//   a rounding of that at these shapes).
// - Model states per GPU (Rajbhandari et al., "ZeRO", SC'20, section 3 and Figure 1): 16-bit
//   parameters and gradients (2 + 2 bytes) and the fp32 master copy with Adam's two moments
//   (K = 12 bytes), over the data degree d: ZeRO-0 16 Psi; ZeRO-1 4 Psi + 12 Psi / d (optimizer
//   states partitioned); ZeRO-2 2 Psi + 14 Psi / d (and gradients); ZeRO-3 16 Psi / d (and
//   parameters). Buffers, fragmentation and activations are not in these figures.
// - Activations per transformer layer per micro-batch, in bytes with 16-bit activations
//   (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
//   MLSys 2023, arXiv:2205.05198, Table 2; s sequence, b micro-batch, h hidden, a heads,
//   t tensor degree): no parallelism sbh(34 + 5as/h); tensor parallel sbh(10 + 24/t +
//   5as/(ht)); tensor + sequence parallel sbh/t (34 + 5as/h); with selective recomputation
//   sbh(10 + 24/t) and 34 sbh/t; full recomputation 2 sbh (the layer's input only; the paper's
//   row; with sequence parallelism that input is split too: 2 sbh / t, our extension). Per GPU
//   a micro-batch holds the layers of one stage, ceil(L / p) of them; under 1F1B the first
//   stage holds p micro-batches at once. The embedding, the final LayerNorm and the loss
//   (Korthikanti's section 4.3 extras) are left out.
// - MoE (expert degree ep): the routed experts split over ep ranks of the data axis, so a GPU
//   holds Psi_d = dense / (t p) and Psi_e = experts / (t p ep); their model states are ZeRO's
//   over the data degree for Psi_d and over the expert-data degree d / ep for Psi_e (DeepSpeed
//   partitions expert parameters over the expert-data-parallel group).
// - The rank layout: DeepSpeed's topology pipe x data x model (comm::Topology; the model axis
//   fastest, so a tensor-parallel group is consecutive ranks, inside a node).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/model_zoo/gpt_config.h"
#include "gpt_flags.h"

namespace dscpp::examples {

struct ActivationRow {
  std::string strategy;        // "tensor + sequence parallel", ...
  std::string formula;         // as Table 2 writes it
  double bytes_per_layer = 0;  // one micro-batch, one transformer layer, one GPU
  bool this_config = false;    // the strategy the model config selects
};

struct DryRunPlan {
  model_zoo::GPTConfig model;
  model_zoo::ParallelismConfig layout;  // resolved: every degree >= 1
  int64_t micro_batch_size = 1;
  int64_t zero_stage = -1;  // the ds_config's stage, -1 when no ds_config was read
  int64_t parameters = 0;
  int64_t active_parameters = 0;  // per token (GPTConfig::active_parameters); = parameters dense
  int64_t expert_parameters = 0;  // the routed experts' (GPTConfig::routed_expert_parameters)
  double parameters_per_gpu = 0;  // Psi = N / (t p); MoE: dense / (t p) + experts / (t p ep)
  double expert_parameters_per_gpu = 0;  // Psi_e = experts / (t p ep), in parameters_per_gpu
  double model_states_bytes[4]{};        // ZeRO stages 0..3, per GPU
  int64_t layers_per_stage = 0;          // ceil(L / p)
  std::vector<ActivationRow> activations;
  std::vector<std::vector<int>> tensor_groups, pipeline_groups, data_groups;
};

// The layout of `model` on `world_size` ranks (world_size 0: the config's own t * p * d, with
// d = 1 where it leaves the data degree out); a ConfigError shows the arithmetic.
model_zoo::ParallelismConfig resolve_layout(const model_zoo::GPTConfig& model, int64_t world_size);

// ZeRO's bytes per GPU of model states for Psi parameters per model-parallel rank.
double zero_model_states_bytes(double psi, int64_t data_degree, int stage);

// Every figure of the dry run. `zero_stage` -1: none marked.
DryRunPlan plan_dry_run(const model_zoo::GPTConfig& model,
                        const model_zoo::ParallelismConfig& layout, int64_t micro_batch_size,
                        int64_t zero_stage = -1);

// The report train_gpt --dry-run prints.
std::string format_dry_run(const DryRunPlan& plan);

// train_gpt --dry-run: reads --model-config (and the ds_config when given, for the
// micro-batch size and the ZeRO stage; --micro-batch-size otherwise, or 1), prints the report to
// stdout unless `quiet` (ranks other than 0 of a launched job), returns the exit status.
// `world_size`: the launcher's, or 0 when not launched. Errors are thrown as the reading
// functions throw them.
int run_dry_run(const GptOptions& options, int64_t world_size, bool quiet);

}  // namespace dscpp::examples
