// The experts of one rank, run on the dispatcher's expert-major rows (rows [N, H] with
// N >= sum(counts), counts int64 [num_local_experts]; token_dispatcher.h), as Megatron-Core's
// two kinds (Experts returns sum(counts) rows, reading the counts on the host; GroupedMLP
// returns N, its rows past sum(counts) unspecified, and waits on nothing):
// - Experts (DeepSpeed's Experts, Megatron's SequentialMLP): num_local_experts independent
//   clones (module->clone(), DeepSpeed's deepcopy) of any Cloneable module [.., H] -> [.., H'],
//   registered as deepspeed_experts.<i>, each run on its own rows.
// - GroupedMLP: the weights of all experts stacked, weight1 [E, H, F] (SwiGLU: [E, H, 2F],
//   gate then up) and weight2 [E, F, H'], products by ops::grouped_mm (one grouped GEMM).
// Initialisation: clones are copies of the module given (DeepSpeed's deepcopy: every expert
// starts equal to it, at any expert-parallel degree, and cloning leaves the default generator
// as it was); GroupedMLP draws each expert from its
// global id (first_expert + local index; nn::uniform_init_experts), so expert g starts with the
// same values at any degree and the default generator advances alike.
// ExpertMLP is the plain expert module (fc1, activation, fc2) for either use.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace dscpp::nn::moe {

// kGelu: the exact (erf) GELU, Megatron's F.gelu; kGeluTanh: its tanh approximation
// (at::gelu(x, "tanh"), GPT-2's), for experts beside dense blocks that use it.
enum class Activation { kGelu, kGeluTanh, kRelu, kSilu, kSwiglu };

// What the MoE layer calls on its experts. run_padded_experts: the padded layout of a capacity
// (rows [E_l, R, H], expert e on rows[e], padding rows among them) -> [E_l, R, H']; by default
// run_experts on R rows each; Experts and GroupedMLP run it reading no count on the host.
class LocalExperts {
 public:
  virtual ~LocalExperts() = default;
  virtual at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& counts) = 0;
  virtual at::Tensor run_padded_experts(const at::Tensor& rows);
  virtual int64_t num_local_experts() const = 0;
};

struct ExpertMLPOptions {
  ExpertMLPOptions(int64_t hidden_size, int64_t ffn_hidden_size)
      : hidden_size_(hidden_size), ffn_hidden_size_(ffn_hidden_size) {}
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, ffn_hidden_size);
  TORCH_ARG(Activation, activation) = Activation::kGelu;
  TORCH_ARG(bool, bias) = true;
};

class ExpertMLPImpl : public torch::nn::Cloneable<ExpertMLPImpl> {
 public:
  explicit ExpertMLPImpl(const ExpertMLPOptions& options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  ExpertMLPOptions options;
  torch::nn::Linear fc1{nullptr};  // [F (SwiGLU: 2F, gate then up), H]
  torch::nn::Linear fc2{nullptr};  // [H, F]
};
TORCH_MODULE(ExpertMLP);

class ExpertsImpl : public torch::nn::Module, public LocalExperts {
 public:
  ExpertsImpl(const torch::nn::AnyModule& expert, int64_t num_local_experts);
  at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& counts) override;
  at::Tensor run_padded_experts(const at::Tensor& rows) override;  // each clone on its rows
  int64_t num_local_experts() const override { return static_cast<int64_t>(experts.size()); }

  std::vector<torch::nn::AnyModule> experts;  // what forward calls
  torch::nn::ModuleList deepspeed_experts;    // the same modules, for their names
};
TORCH_MODULE(Experts);

struct GroupedMLPOptions {
  GroupedMLPOptions(int64_t num_local_experts, int64_t hidden_size, int64_t ffn_hidden_size)
      : num_local_experts_(num_local_experts),
        hidden_size_(hidden_size),
        ffn_hidden_size_(ffn_hidden_size) {}
  TORCH_ARG(int64_t, num_local_experts);
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, ffn_hidden_size);
  TORCH_ARG(Activation, activation) = Activation::kGelu;
  // The global id of local expert 0 (expert-parallel rank r of E / E_l: r * E_l); 0 at ep 1.
  TORCH_ARG(int64_t, first_expert) = 0;
};

class GroupedMLPImpl : public torch::nn::Module, public LocalExperts {
 public:
  explicit GroupedMLPImpl(const GroupedMLPOptions& options);
  at::Tensor run_experts(const at::Tensor& rows, const at::Tensor& counts) override;
  // Two batched products (at::bmm over the experts): equal groups need no offsets.
  at::Tensor run_padded_experts(const at::Tensor& rows) override;
  int64_t num_local_experts() const override { return options.num_local_experts(); }

  GroupedMLPOptions options;
  // Each expert's init as nn.Linear's (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), by its global id.
  at::Tensor weight1;  // [E, H, F] (SwiGLU: [E, H, 2F])
  at::Tensor weight2;  // [E, F, H]
};
TORCH_MODULE(GroupedMLP);

// The activation between the two products (SwiGLU: silu(gate) * up over the halves of x).
at::Tensor apply_activation(const at::Tensor& x, Activation activation);

}  // namespace dscpp::nn::moe
