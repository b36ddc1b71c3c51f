// The local experts: see experts.h.
#include "dscpp/nn/moe/experts.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/module_scope.h"
#include "dscpp/nn/moe/token_dispatcher.h"
#include "dscpp/nn/normal_init.h"
#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/grouped_mm.h"

namespace dscpp::nn::moe {

namespace {

std::vector<int64_t> host_counts(const at::Tensor& counts, int64_t experts, int64_t rows) {
  if (counts.dim() != 1 || counts.size(0) != experts)
    throw dscpp::Error("MoE experts: counts must be [" + std::to_string(experts) + "], got " +
                       std::to_string(counts.numel()) + " values");
  note_host_count_read();
  at::Tensor c = counts.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> out(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + experts);
  int64_t total = 0;
  for (int64_t n : out) total += n;
  if (total > rows)
    throw dscpp::Error("MoE experts: counts sum to " + std::to_string(total) + ", more than the " +
                       std::to_string(rows) + " rows");
  return out;
}

void check_padded(const at::Tensor& rows, int64_t experts) {
  if (!rows.defined() || rows.dim() != 3 || rows.size(0) != experts)
    throw dscpp::Error("MoE experts: padded rows must be [" + std::to_string(experts) +
                       ", R, H], got " + std::to_string(rows.defined() ? rows.dim() : 0) +
                       " dimensions");
}

}  // namespace

at::Tensor LocalExperts::run_padded_experts(const at::Tensor& rows) {
  check_padded(rows, num_local_experts());
  const int64_t e = rows.size(0), r = rows.size(1);
  // The counts are the layout's, known here: nothing routed is read.
  at::Tensor out = run_experts(rows.reshape({e * r, rows.size(2)}), at::full({e}, r, at::kLong));
  return out.view({e, r, -1});
}

at::Tensor apply_activation(const at::Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return at::gelu(x);
    case Activation::kGeluTanh:
      return at::gelu(x, "tanh");
    case Activation::kRelu:
      return at::relu(x);
    case Activation::kSilu:
      return at::silu(x);
    case Activation::kSwiglu:
      return ops::swiglu(x);  // one kernel each way on a GPU, no chunk or cat copies
  }
  throw dscpp::Error("MoE: unknown activation");
}

ExpertMLPImpl::ExpertMLPImpl(const ExpertMLPOptions& options_) : options(options_) {
  reset();
}

void ExpertMLPImpl::reset() {
  const int64_t f = options.ffn_hidden_size();
  const int64_t up = options.activation() == Activation::kSwiglu ? 2 * f : f;
  fc1 = register_module(
      "fc1",
      torch::nn::Linear(torch::nn::LinearOptions(options.hidden_size(), up).bias(options.bias())));
  fc2 = register_module(
      "fc2",
      torch::nn::Linear(torch::nn::LinearOptions(f, options.hidden_size()).bias(options.bias())));
}

at::Tensor ExpertMLPImpl::forward(const at::Tensor& x) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  at::Tensor h = apply_activation(nn::linear(x, fc1->weight, fc1->bias), options.activation());
  return nn::linear(h, fc2->weight, fc2->bias);
}

ExpertsImpl::ExpertsImpl(const torch::nn::AnyModule& expert, int64_t num_local_experts) {
  if (expert.is_empty()) throw dscpp::Error("MoE Experts: the expert module is empty");
  if (num_local_experts < 1)
    throw dscpp::Error("MoE Experts: num_local_experts must be >= 1, got " +
                       std::to_string(num_local_experts));
  deepspeed_experts = register_module("deepspeed_experts", torch::nn::ModuleList());
  // Module::clone() resets each copy (its parameters drawn from the default generator) before
  // copying the original's values in; DeepSpeed's deepcopy draws nothing. The generator's state
  // is put back, so that cloning E_l experts leaves it where it was whatever E_l (the expert
  // degree) is, and what is built after the layer does not depend on the degree.
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor state = gen.get_state();
  for (int64_t i = 0; i < num_local_experts; ++i) {
    experts.push_back(expert.clone());
    deepspeed_experts->push_back(experts.back().ptr());
  }
  gen.set_state(state);
}

at::Tensor ExpertsImpl::run_experts(const at::Tensor& rows, const at::Tensor& counts) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  std::vector<int64_t> n = host_counts(counts, num_local_experts(), rows.size(0));
  std::vector<at::Tensor> out;
  int64_t begin = 0;
  // Every expert runs, on no rows where it got none (as DeepSpeed runs each on its slice of the
  // capacity buffer): its parameters then get a gradient (zeros) on every rank, and the output
  // depends on the dispatched rows even where none arrived, so backward is the same graph on
  // every rank: the combine's and the dispatch's all-to-alls and every expert's gradient hook
  // run everywhere. (Skipping them hung 4 ranks: a rank that received no rows left out the
  // backward all-to-alls its expert-parallel peers ran.)
  for (size_t e = 0; e < n.size(); ++e) {
    out.push_back(experts[e].forward(rows.narrow(0, begin, n[e])));
    begin += n[e];
  }
  // Rows past the counts (the permutation's padding) are not run: the output has begin rows.
  return at::cat(out, 0);
}

at::Tensor ExpertsImpl::run_padded_experts(const at::Tensor& rows) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  check_padded(rows, num_local_experts());
  std::vector<at::Tensor> out;
  for (size_t e = 0; e < experts.size(); ++e)
    out.push_back(experts[e].forward(rows.select(0, static_cast<int64_t>(e))));
  return at::stack(out, 0);
}

GroupedMLPImpl::GroupedMLPImpl(const GroupedMLPOptions& options_) : options(options_) {
  const int64_t e = options.num_local_experts(), h = options.hidden_size(),
                f = options.ffn_hidden_size();
  if (e < 1 || h < 1 || f < 1)
    throw dscpp::Error("MoE GroupedMLP: experts, hidden and ffn sizes must be positive");
  const int64_t up = options.activation() == Activation::kSwiglu ? 2 * f : f;
  if (options.first_expert() < 0)
    throw dscpp::Error("MoE GroupedMLP: first_expert must be >= 0, got " +
                       std::to_string(options.first_expert()));
  // nn.Linear's default init (kaiming_uniform(a = sqrt 5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
  // each expert from its global id's stream (experts.h).
  weight1 = register_parameter("weight1", at::empty({e, h, up}));
  weight2 = register_parameter("weight2", at::empty({e, f, h}));
  nn::uniform_init_experts(weight1, 1.0 / std::sqrt(h), options.first_expert());
  nn::uniform_init_experts(weight2, 1.0 / std::sqrt(f), options.first_expert());
}

at::Tensor GroupedMLPImpl::run_experts(const at::Tensor& rows, const at::Tensor& counts) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  // One grouping for both products and their backward: the offsets are formed once.
  const at::Tensor offsets = ops::grouped_mm_uses_aten(rows, weight1)
                                 ? ops::grouped_mm_offsets(counts, rows.device())
                                 : at::Tensor();
  at::Tensor h =
      apply_activation(ops::grouped_mm(rows, weight1, counts, offsets), options.activation());
  return ops::grouped_mm(h, weight2, counts, offsets);
}

at::Tensor GroupedMLPImpl::run_padded_experts(const at::Tensor& rows) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  check_padded(rows, num_local_experts());
  return at::bmm(apply_activation(at::bmm(rows, weight1), options.activation()), weight2);
}

}  // namespace dscpp::nn::moe
