// The MoE layer: see moe.h.
#include "dscpp/nn/moe/moe.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/module_scope.h"
#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn::moe {

namespace {

void check_moe(bool ok, const std::string& what) {
  if (!ok) throw dscpp::Error("MoE: " + what);
}

TopKGateOptions gate_options(const MoEOptions& o) {
  return TopKGateOptions(o.hidden_size(), o.num_experts())
      .k(o.k())
      .capacity_factor(o.capacity_factor())
      .eval_capacity_factor(o.eval_capacity_factor())
      .min_capacity(o.min_capacity())
      .noisy_gate_policy(o.noisy_gate_policy())
      .drop_tokens(o.drop_tokens())
      .use_rts(o.use_rts())
      .top2_2nd_expert_sampling(o.top2_2nd_expert_sampling())
      .score_function(o.score_function())
      .topk_scaling_factor(o.topk_scaling_factor())
      .z_loss_coeff(o.z_loss_coeff())
      .seq_aux_loss_coeff(o.seq_aux_loss_coeff())
      .num_groups(o.num_groups() > 0 ? o.num_groups() : o.ep_size())
      .group_topk(o.group_topk())
      .enable_expert_bias(o.enable_expert_bias())
      .bias_update_rate(o.bias_update_rate())
      .sequence_partition_group(o.sequence_parallel() ? o.tensor_group() : o.sequence_group())
      .sequence_major_shards(o.sequence_parallel());
}

nn::TensorParallelAttr partial() {
  nn::TensorParallelAttr a;
  a.sequence_parallel = true;
  return a;
}

// The padded layout (a 3-D ExpertInput) or the grouped rows.
at::Tensor run_local_experts(LocalExperts& experts, const ExpertInput& in) {
  return in.rows.dim() == 3 ? experts.run_padded_experts(in.rows)
                            : experts.run_experts(in.rows, in.counts);
}

}  // namespace

MOELayerImpl::MOELayerImpl(TopKGate gate_, std::shared_ptr<torch::nn::Module> experts_,
                           std::unique_ptr<TokenDispatcher> dispatcher_, GroupPtr tensor_group_,
                           bool sequence_parallel_)
    : dispatcher(std::move(dispatcher_)),
      tensor_group(tensor_model_parallel_size(tensor_group_) > 1 ? std::move(tensor_group_)
                                                                 : nullptr),
      sequence_parallel(sequence_parallel_) {
  check_moe(!sequence_parallel || tensor_group,
            "sequence_parallel needs the tensor_group of more than one rank whose shard the tokens "
            "are");
  gate = register_module("gate", std::move(gate_));
  experts = register_module("experts", std::move(experts_));
  local_experts = dynamic_cast<LocalExperts*>(experts.get());
  check_moe(local_experts != nullptr, "the experts module must implement LocalExperts");
  check_moe(dispatcher != nullptr, "no token dispatcher");
}

std::pair<at::Tensor, Routing> MOELayerImpl::forward(const at::Tensor& tokens, int64_t seq_length,
                                                     const at::Tensor& expert_tokens,
                                                     const at::Tensor& used_token,
                                                     const BesideExchanges& beside) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  Routing routing = gate->forward(tokens, seq_length, used_token);
  const at::Tensor& dispatched = expert_tokens.defined() ? expert_tokens : tokens;
  // Sequence parallelism: the tokens are already this rank's own.
  if (!tensor_group || sequence_parallel) {
    ExpertInput in = dispatcher->dispatch(dispatched, routing, beside.dispatch);
    at::Tensor out = run_local_experts(*local_experts, in);
    return {dispatcher->combine(out, beside.combine), std::move(routing)};
  }
  // The token split (moe.h): this rank's 1/t of the routed tokens, by the same chunks as the
  // scatter's.
  const int64_t t = tensor_group->size(), s = tokens.size(0);
  check_moe(s % t == 0, "the tensor-parallel token split needs the tokens of a forward (" +
                            std::to_string(s) + ") to divide by the tensor-parallel degree (" +
                            std::to_string(t) + ")");
  const int64_t n = s / t, first = tensor_group->rank() * n;
  Routing mine = routing;
  mine.indices = routing.indices.narrow(0, first, n);
  if (routing.kept.defined()) mine.kept = routing.kept.narrow(0, first, n);
  // The combine weights' gradient all-gathered back: the gate's gradient is whole everywhere.
  mine.weights = scatter_to_sequence_parallel_region(routing.weights, tensor_group);
  ExpertInput in = dispatcher->dispatch(
      scatter_to_sequence_parallel_region(dispatched, tensor_group), mine, beside.dispatch);
  at::Tensor out = dispatcher->combine(run_local_experts(*local_experts, in), beside.combine);
  // The output's gradient is whole on every rank (a replicated region): keep this chunk's.
  return {gather_from_sequence_parallel_region(out, tensor_group, false), std::move(routing)};
}

std::map<std::string, nn::TensorParallelAttr> MOELayerImpl::tensor_parallel_attributes() const {
  if (!tensor_group) return {};
  std::map<std::string, nn::TensorParallelAttr> out;
  for (const auto& p : experts->named_parameters()) out["experts." + p.key()] = partial();
  if (sequence_parallel) out["gate.wg.weight"] = partial();
  return out;
}

std::map<std::string, nn::TensorParallelAttr> MoEImpl::tensor_parallel_attributes() const {
  if (!deepspeed_moe->sequence_parallel) return {};
  std::map<std::string, nn::TensorParallelAttr> out;
  for (const auto& p : named_parameters()) {
    const std::string& name = p.key();
    for (const char* part : {"latent_down.", "latent_up.", "coefficient.", "mlp."})
      if (name.rfind(part, 0) == 0) out[name] = partial();
  }
  return out;
}

MoEImpl::MoEImpl(const MoEOptions& options_) : options(options_) {
  const MoEOptions& o = options;
  check_moe(o.hidden_size() > 0, "hidden_size must be positive");
  check_moe(o.ep_size() >= 1 && o.num_experts() % o.ep_size() == 0,
            "num_experts (" + std::to_string(o.num_experts()) + ") must be divisible by ep_size (" +
                std::to_string(o.ep_size()) + ")");
  if (o.ep_size() > 1 || o.ep_group())
    check_moe(o.ep_group() && o.ep_group()->size() == o.ep_size(),
              "ep_size = " + std::to_string(o.ep_size()) + " needs ep_group, the expert-parallel " +
                  "group of ep_size ranks; got " +
                  (o.ep_group() ? "a group of " + std::to_string(o.ep_group()->size()) + " ranks"
                                : std::string("none")));
  if (tensor_model_parallel_size(o.sequence_group()) > 1) {
    check_moe(!o.sequence_parallel(),
              "a sequence group (DeepSpeed-Ulysses) beside Megatron's sequence parallelism: the "
              "router takes one token partition");
  }
  check_moe(o.latent_size() >= 0, "latent_size must be >= 0");
  const int64_t width = o.latent_size() > 0 ? o.latent_size() : o.hidden_size();
  const int64_t local = o.num_experts() / o.ep_size();

  std::shared_ptr<torch::nn::Module> experts;
  if (!o.expert().is_empty()) {
    experts = Experts(o.expert(), local).ptr();
  } else {
    check_moe(o.ffn_hidden_size() > 0,
              "no expert module and no ffn_hidden_size for the grouped experts");
    // Local expert j is global expert ep_rank * local + j (moe.h): drawn by that id.
    const int64_t first = o.ep_group() ? o.ep_group()->rank() * local : 0;
    experts = GroupedMLP(GroupedMLPOptions(local, width, o.ffn_hidden_size())
                             .activation(o.activation())
                             .first_expert(first))
                  .ptr();
  }
  std::unique_ptr<TokenDispatcher> dispatcher;
  if (o.ep_size() > 1)
    dispatcher = std::make_unique<AllToAllTokenDispatcher>(o.ep_group());
  else
    dispatcher = std::make_unique<LocalTokenDispatcher>();
  deepspeed_moe = register_module(
      "deepspeed_moe", MOELayer(TopKGate(gate_options(o)), experts, std::move(dispatcher),
                                o.tensor_group(), o.sequence_parallel()));
  if (o.use_residual()) {
    check_moe(!o.expert().is_empty(), "use_residual needs the expert module (its dense MLP)");
    mlp = o.expert();
    register_module("mlp", mlp.ptr());
    coefficient = register_module("coefficient", torch::nn::Linear(o.hidden_size(), 2));
  }
  if (!o.shared_expert().is_empty()) {
    shared_experts = o.shared_expert();
    register_module("shared_experts", shared_experts.ptr());
  }
  if (o.latent_size() > 0) {
    latent_down = register_module(
        "latent_down",
        torch::nn::Linear(torch::nn::LinearOptions(o.hidden_size(), width).bias(false)));
    latent_up = register_module(
        "latent_up",
        torch::nn::Linear(torch::nn::LinearOptions(width, o.hidden_size()).bias(false)));
  }
}

MoEOutput MoEImpl::forward(const at::Tensor& hidden_states, const at::Tensor& used_token) {
  const int64_t h = options.hidden_size();
  check_moe(hidden_states.dim() >= 1 && hidden_states.size(-1) == h,
            "hidden_states must end in hidden_size " + std::to_string(h));
  at::Tensor tokens = hidden_states.reshape({-1, h});
  // [B, T, H], or with sequence parallelism the shard [T/t, B, H].
  const int64_t seq_length =
      hidden_states.dim() == 3 ? hidden_states.size(options.sequence_parallel() ? 0 : 1) : 0;
  at::Tensor expert_tokens;
  if (latent_down) expert_tokens = nn::linear(tokens, latent_down->weight);
  // What depends on nothing routed, beside the exchanges (moe.h), or after the routed path.
  at::Tensor shared, out_mlp, coef;
  const auto run_shared = [&] { shared = shared_experts.forward(hidden_states); };
  const auto run_residual = [&] {
    out_mlp = mlp.forward(hidden_states);
    coef = at::softmax(nn::linear(hidden_states, coefficient->weight, coefficient->bias), -1);
  };
  BesideExchanges beside;
  if (options.shared_expert_overlap() && options.ep_size() > 1) {
    if (!shared_experts.is_empty()) beside.dispatch = run_shared;
    if (options.use_residual()) beside.combine = run_residual;
  }
  auto [combined, routing] =
      deepspeed_moe->forward(tokens, seq_length, expert_tokens,
                             used_token.defined() ? used_token.reshape({-1}) : used_token, beside);
  if (latent_up) combined = nn::linear(combined, latent_up->weight);
  at::Tensor output = combined.reshape(hidden_states.sizes());
  if (!shared_experts.is_empty()) {
    if (!shared.defined()) run_shared();
    output = output + shared;
  }
  if (options.use_residual()) {
    if (!out_mlp.defined()) run_residual();
    output = output * coef.narrow(-1, 0, 1) + out_mlp * coef.narrow(-1, 1, 1);
  }
  if (routing.z_loss.defined()) add_aux_loss(routing.z_loss);
  if (routing.seq_aux_loss.defined()) add_aux_loss(routing.seq_aux_loss);
  return {output, routing.l_aux, routing.exp_counts};
}

}  // namespace dscpp::nn::moe
