// train_gpt --dry-run: the figures of dry_run.h and their report.
#include "dry_run.h"

#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <sstream>

#include "dscpp/comm/topology.h"
#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/config/json_text.h"

namespace dscpp::examples {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// GiB from one GiB up, MiB below (a layer's activations at small shapes).
std::string gib(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", bytes / kGiB);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

// 1315819520 -> "1,315,819,520"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string ranks(const std::vector<int>& group) {
  std::string s = "[";
  // A data group of the 535B layout has 64 ranks: its first and last few say its stride.
  for (size_t i = 0; i < group.size(); ++i) {
    if (group.size() > 8 && i == 3) {
      s += ", ...";
      i = group.size() - 2;
    }
    s += fmt::format("{}{}", i == 0 ? "" : ", ", group[i]);
  }
  return s + "]";
}

std::string groups_line(const char* name, const std::vector<std::vector<int>>& groups) {
  std::string s = fmt::format("  {:<16} {} of {}:", name, groups.size(), groups.front().size());
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups.size() > 6 && i == 4) {
      s += " ...";
      i = groups.size() - 1;
    }
    s += " " + ranks(groups[i]);
  }
  return s;
}

}  // namespace

model_zoo::ParallelismConfig resolve_layout(const model_zoo::GPTConfig& model, int64_t world_size) {
  const auto& p = model.parallelism;
  if (world_size == 0)
    world_size = p.tensor_model_parallel_size * p.pipeline_model_parallel_size *
                 std::max<int64_t>(p.data_parallel_size, 1);
  model_zoo::ParallelismConfig r = p.resolve(world_size);
  // comm::Topology counts ranks in an int; real jobs are a few thousand ranks.
  constexpr int64_t kMaxRanks = int64_t{1} << 24;
  if (world_size > kMaxRanks)
    throw ConfigError("parallelism", fmt::format("{} ranks: more than the {} a dry run lays out",
                                                 world_size, kMaxRanks));
  if (r.tensor_model_parallel_size > 1 &&
      model.num_attention_heads % r.tensor_model_parallel_size != 0)
    throw ConfigError("parallelism.tensor_model_parallel_size",
                      fmt::format("the {} attention heads do not split across {} tensor-parallel "
                                  "ranks: expected a divisor of num_attention_heads",
                                  model.num_attention_heads, r.tensor_model_parallel_size));
  if (r.pipeline_model_parallel_size > model.num_layers)
    throw ConfigError("parallelism.pipeline_model_parallel_size",
                      fmt::format("{} pipeline stages for {} layers: expected at most num_layers",
                                  r.pipeline_model_parallel_size, model.num_layers));
  return r;
}

double zero_model_states_bytes(double psi, int64_t data_degree, int stage) {
  const double d = static_cast<double>(data_degree);
  switch (stage) {
    case 0:
      return 16 * psi;
    case 1:
      return 4 * psi + 12 * psi / d;
    case 2:
      return 2 * psi + 14 * psi / d;
    default:
      return 16 * psi / d;
  }
}

DryRunPlan plan_dry_run(const model_zoo::GPTConfig& model,
                        const model_zoo::ParallelismConfig& layout, int64_t micro_batch_size,
                        int64_t zero_stage) {
  DryRunPlan r;
  r.model = model;
  r.layout = layout;
  r.micro_batch_size = micro_batch_size;
  r.zero_stage = zero_stage;
  const int64_t t = layout.tensor_model_parallel_size, p = layout.pipeline_model_parallel_size,
                d = layout.data_parallel_size;
  const int64_t ep = layout.expert_model_parallel_size;
  r.parameters = model.num_parameters();
  r.active_parameters = model.active_parameters();
  r.expert_parameters = model.routed_expert_parameters();
  const double dense =
      static_cast<double>(r.parameters - r.expert_parameters) / static_cast<double>(t * p);
  r.expert_parameters_per_gpu =
      static_cast<double>(r.expert_parameters) / static_cast<double>(t * p * ep);
  r.parameters_per_gpu = dense + r.expert_parameters_per_gpu;
  for (int stage = 0; stage < 4; ++stage)
    r.model_states_bytes[stage] =
        zero_model_states_bytes(dense, d, stage) +
        (r.expert_parameters > 0
             ? zero_model_states_bytes(r.expert_parameters_per_gpu, d / ep, stage)
             : 0.0);
  r.layers_per_stage = (model.num_layers + p - 1) / p;

  const double s = static_cast<double>(model.seq_length), b = static_cast<double>(micro_batch_size),
               h = static_cast<double>(model.hidden_size),
               a = static_cast<double>(model.num_attention_heads), td = static_cast<double>(t);
  const double sbh = s * b * h;
  const bool sp = layout.sequence_parallel, full = model.checkpoint_activations;
  r.activations = {
      {"no parallelism", "sbh(34 + 5as/h)", sbh * (34 + 5 * a * s / h), t == 1 && !full},
      {fmt::format("tensor parallel (t={})", t), "sbh(10 + 24/t + 5as/(ht))",
       sbh * (10 + 24 / td + 5 * a * s / (h * td)), t > 1 && !sp && !full},
      {"tensor + sequence parallel", "sbh/t (34 + 5as/h)", sbh / td * (34 + 5 * a * s / h),
       sp && !full},
      {"tensor parallel + selective recompute", "sbh(10 + 24/t)", sbh * (10 + 24 / td), false},
      {"tensor + sequence + selective", "34 sbh/t", 34 * sbh / td, false},
      {"full recompute", "2 sbh", 2 * sbh, full && !sp},
      {"full recompute + sequence parallel", "2 sbh/t", 2 * sbh / td, full && sp},
  };

  comm::Topology topo({"pipe", "data", "model"},
                      {static_cast<int>(p), static_cast<int>(d), static_cast<int>(t)});
  r.tensor_groups = topo.get_axis_comm_lists("model");
  r.pipeline_groups = topo.get_axis_comm_lists("pipe");
  r.data_groups = topo.get_axis_comm_lists("data");
  return r;
}

std::string format_dry_run(const DryRunPlan& r) {
  const auto& m = r.model;
  const auto& l = r.layout;
  const int64_t t = l.tensor_model_parallel_size, p = l.pipeline_model_parallel_size,
                d = l.data_parallel_size;
  std::ostringstream out;
  out << fmt::format(
      "dry run: GPT, hidden {}, {} layers, {} heads, sequence {}, vocabulary {}, FFN {}\n",
      m.hidden_size, m.num_layers, m.num_attention_heads, m.seq_length, m.vocab_size, m.ffn_size());
  out << fmt::format("parameters: {} ({:.2f} B); per GPU after the model split (/ t p = {}): {}\n",
                     grouped(r.parameters), static_cast<double>(r.parameters) / 1e9, t * p,
                     grouped(static_cast<int64_t>(std::llround(r.parameters_per_gpu))));
  if (m.moe.enabled()) {
    out << fmt::format(
        "active parameters per token: {} ({:.2f} B): {} MoE layers of {} routed experts top-{}{}{}"
        "\n",
        grouped(r.active_parameters), static_cast<double>(r.active_parameters) / 1e9,
        m.moe.num_moe_layers(), m.moe.num_experts, m.moe.moe_router_topk,
        m.moe.moe_shared_expert_intermediate_size > 0
            ? fmt::format(" + shared FFN {}", m.moe.moe_shared_expert_intermediate_size)
            : std::string(),
        m.moe.moe_latent_size > 0 ? fmt::format(", latent {}", m.moe.moe_latent_size)
                                  : std::string());
    out << fmt::format(
        "routed experts: {} ({:.2f} B), split over expert degree {}: {} per GPU; the rest {} per "
        "GPU\n",
        grouped(r.expert_parameters), static_cast<double>(r.expert_parameters) / 1e9,
        l.expert_model_parallel_size,
        grouped(static_cast<int64_t>(std::llround(r.expert_parameters_per_gpu))),
        grouped(static_cast<int64_t>(
            std::llround(r.parameters_per_gpu - r.expert_parameters_per_gpu))));
  }
  out << fmt::format(
      "layout: tensor {} x pipeline {} x data {} = {} ranks{}{}\n", t, p, d, t * p * d,
      l.sequence_parallel ? ", sequence parallel" : "",
      l.expert_model_parallel_size > 1
          ? fmt::format(", experts over {} of the data ranks (expert-data "
                        "degree {})",
                        l.expert_model_parallel_size, d / l.expert_model_parallel_size)
          : std::string());
  out << "model states per GPU (16-bit params + grads, fp32 master + Adam moments: 2 + 2 + 12 "
         "bytes/param, the ZeRO paper's; Psi = params per GPU, d = "
      << d
      << (r.expert_parameters > 0 ? "; the experts' share over the expert-data degree d / ep" : "")
      << "):\n";
  const char* formulas[4] = {"16 Psi", "4 Psi + 12 Psi/d", "2 Psi + 14 Psi/d", "16 Psi/d"};
  for (int stage = 0; stage < 4; ++stage)
    out << fmt::format("  ZeRO-{}  {:<18} {:>12}{}\n", stage, formulas[stage],
                       gib(r.model_states_bytes[stage]),
                       stage == r.zero_stage ? "   <- the ds_config's stage" : "");
  out << fmt::format(
      "activation memory per micro-batch per GPU (micro-batch {}, {} layers on a stage; "
      "Korthikanti et al. 2022, Table 2, 16-bit activations):\n",
      r.micro_batch_size, r.layers_per_stage);
  // The paper's counts are of GPT-2's block; a current model's differ (e.g. SwiGLU's wider MLP
  // input, GQA's narrower k and v), so the table is an estimate for it.
  if (const std::string key = m.first_non_gpt2_block_key(); !key.empty())
    out << fmt::format("  (counted for GPT-2's block; this model's {} differs: an estimate)\n",
                       key);
  out << fmt::format("  {:<40} {:<26} {:>12} {:>14}\n", "", "per layer", "", "per micro-batch");
  for (const auto& row : r.activations)
    out << fmt::format("  {:<40} {:<26} {:>12} {:>14}{}\n", row.strategy, row.formula,
                       gib(row.bytes_per_layer),
                       gib(row.bytes_per_layer * static_cast<double>(r.layers_per_stage)),
                       row.this_config ? "   <- this config" : "");
  if (p > 1)
    out << fmt::format("  (under 1F1B the first stage holds {} micro-batches at once: x {})\n", p,
                       p);
  out << "rank layout (DeepSpeed's pipe x data x model, model fastest):\n";
  out << groups_line("tensor groups", r.tensor_groups) << "\n";
  out << groups_line("pipeline groups", r.pipeline_groups) << "\n";
  out << groups_line("data groups", r.data_groups) << "\n";
  return out.str();
}

int run_dry_run(const GptOptions& options, int64_t world_size, bool quiet) {
  const auto model = model_zoo::GPTConfig::from_file(options.model_config);
  const auto layout = resolve_layout(model, world_size);
  int64_t micro = options.micro_batch_size.value_or(1), stage = -1;
  if (!options.ds_config.empty()) {
    // The flags fill the ds_config as a real run's would, over the data-parallel ranks.
    const nlohmann::json ds =
        apply_gpt_flags(config::read_config(options.ds_config), options, layout.data_parallel_size);
    // DeepSpeed's batch rule and stage, as the engine would resolve them.
    ConfigOptions co;
    co.world_size = layout.data_parallel_size;
    const DSConfig resolved = parse_ds_config(ds, co);
    micro = resolved.train_micro_batch_size_per_gpu;
    stage = resolved.zero_optimization.stage;
  }
  if (!quiet) std::cout << format_dry_run(plan_dry_run(model, layout, micro, stage)) << std::flush;
  return 0;
}

}  // namespace dscpp::examples
