// DeepSpeed's MoE layer (deepspeed/moe/layer.py) on one expert-parallel rank: router (TopKGate),
// token dispatcher and experts, each replaceable (Megatron-Core's split), under DeepSpeed's
// module names (deepspeed_moe.gate.wg.weight, deepspeed_moe.experts.deepspeed_experts.<i>.*,
// mlp.*, coefficient.*), so its state dict reads like DeepSpeed's.
//
// forward(hidden_states [..., H]) returns (output [..., H], l_aux, exp_counts) as DeepSpeed:
// l_aux unscaled (the caller adds coeff · l_aux to its loss); the router's z-loss and
// sequence-wise aux loss, which carry their own coefficients, go to nn::add_aux_loss (the
// caller runs the layer under an AuxLossScope). A [B, T, H] input is B sequences of T tokens.
//
// The experts: clones of `expert` (any Cloneable module, DeepSpeed's API) or, without one, a
// GroupedMLP of ffn_hidden_size. Beside them: use_residual (Residual MoE: output·c0 + mlp(x)·c1,
// c = softmax(coefficient(x)), mlp the given expert itself), shared_expert (added to the routed
// output) and latent_size (LatentMoE: the router sees x, the experts work on latent_down(x) and
// the combined output is latent_up'ed back to H).
//
// Expert parallelism (ep_size > 1): ep_group is the expert-parallel group (ep_size ranks,
// comm::new_expert_groups, DeepSpeed's groups for ep_size); this rank holds experts
// [r*E_l, (r+1)*E_l), E_l = num_experts / ep_size, named locally 0..E_l-1 as DeepSpeed's;
// tokens go permute -> all-to-all -> local experts -> all-to-all -> unpermute (with a
// capacity, in DeepSpeed's fixed [E, C, H] layout: one fixed-size all-to-all each way and no
// count read on the host; dropless, a variable-size one after the counts' exchange:
// expert_parallel_dispatch.h). The gate, the capacity, l_aux and exp_counts are this rank's
// own (DeepSpeed). The caller reduces expert gradients over the expert-data-parallel group and
// the rest over the data group.
//
// Overlap (shared_expert_overlap, on by default, at ep_size > 1): the shared expert runs while
// the dispatch's all-to-all is on the wire, use_residual's MLP and coefficient while the
// combine's is; in backward, by the order autograd runs its nodes (all_to_all_in_flight.h),
// the shared expert's backward runs while the dispatch's reverse exchange is on the wire and
// the residual's while the combine's is. The gate's backward and the experts' do not overlap
// (they need the exchanged gradients, or run after both). Off: the serial order, the shared
// expert and the residual after the routed path; the results are the same bit for bit.
//
// Inside a tensor-parallel model (tensor_group of t > 1 ranks; Megatron's tensor parallelism
// without sequence parallelism, so the layer's input and output are replicated over the
// group): every rank routes all S tokens alike (the gate, capacity, l_aux and exp_counts are
// those of t = 1), then dispatches only its 1/t of them, the outputs all-gathered after the
// combine (DeepSpeed's drop_tokens / gather_tokens, which divide the all-to-all traffic and
// the expert work by t). The token slice enters by a scatter whose backward all-gathers (the
// input's and the combine weights' gradients are whole on every rank, so the gate and
// everything before it stay replicas), and leaves by an all-gather whose backward keeps this
// rank's chunk: the experts' gradients are partial sums over the tensor group, which
// tensor_parallel_attributes() marks (sequence_parallel: the engine sums them over the model
// group, and the experts stay equal on every tensor rank). S must divide by t.
//
// With sequence parallelism as well (sequence_parallel, Megatron's layout): the input is this
// tensor rank's shard of the sequence, [T/t, B, H] sequence-major, and the layer routes and
// dispatches its own tokens, with no split and no gather; the router runs over the shard with
// the tensor group as its sequence_partition_group (router.h: the counts summed over the group,
// each aux loss this rank's part, the capacity the shard's own, as Megatron's). Every parameter
// the shard's tokens reach but no collective sums (the experts, the router's weight, the latent
// projections, Residual MoE's mlp and coefficient) then has a partial gradient: all marked
// sequence_parallel. The shared expert is the caller's module, sequence-parallel itself where it
// must be (model_zoo's TensorParallelGPTMLP).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <string>

#include "dscpp/nn/moe/expert_parallel_dispatch.h"
#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/router.h"
#include "dscpp/nn/moe/token_dispatcher.h"
#include "dscpp/nn/tensor_parallel_attr.h"

namespace dscpp::nn::moe {

struct MoEOptions {
  explicit MoEOptions(int64_t hidden_size) : hidden_size_(hidden_size) {}
  // DeepSpeed's MoE arguments and defaults.
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(torch::nn::AnyModule, expert);  // empty: a GroupedMLP of ffn_hidden_size
  TORCH_ARG(int64_t, num_experts) = 1;
  TORCH_ARG(int64_t, ep_size) = 1;
  TORCH_ARG(GroupPtr, ep_group);  // ep_size > 1: the expert-parallel group, of ep_size ranks
  // The model-parallel group of a tensor-parallel model (see above); null or one rank: none.
  TORCH_ARG(GroupPtr, tensor_group);
  // The input is tensor_group's sequence shard (see above); false: replicated over the group.
  TORCH_ARG(bool, sequence_parallel) = false;
  // DeepSpeed-Ulysses' group: the input is this rank's slice of every sequence (batch-major);
  // the router counts over the group as over Megatron's shards (router.h's
  // sequence_partition_group: the aux losses each rank's part, the capacity the slice's own).
  // No parameter is marked: the engine sums every gradient over the sequence ranks anyway.
  // seq_aux_loss's per-sequence sums read the slices batch-major. Not with sequence_parallel.
  TORCH_ARG(GroupPtr, sequence_group);
  TORCH_ARG(int64_t, k) = 1;
  TORCH_ARG(double, capacity_factor) = 1.0;  // 0: dropless
  TORCH_ARG(double, eval_capacity_factor) = 1.0;
  TORCH_ARG(int64_t, min_capacity) = 4;
  TORCH_ARG(std::string, noisy_gate_policy) = "";  // None, Jitter, RSample
  TORCH_ARG(bool, drop_tokens) = true;
  TORCH_ARG(bool, use_rts) = true;
  TORCH_ARG(bool, use_residual) = false;
  TORCH_ARG(bool, top2_2nd_expert_sampling) = true;
  // Current models (router.h says what each does).
  TORCH_ARG(ScoreFunction, score_function) = ScoreFunction::kSoftmax;
  TORCH_ARG(double, topk_scaling_factor) = 1.0;
  TORCH_ARG(double, z_loss_coeff) = 0.0;
  TORCH_ARG(double, seq_aux_loss_coeff) = 0.0;
  TORCH_ARG(int64_t, num_groups) = 0;  // device-limited routing's groups; 0: ep_size
  TORCH_ARG(int64_t, group_topk) = 0;  // 0: unlimited
  TORCH_ARG(bool, enable_expert_bias) = false;
  TORCH_ARG(double, bias_update_rate) = 1e-3;
  TORCH_ARG(int64_t, ffn_hidden_size) = 0;  // the GroupedMLP experts' width
  TORCH_ARG(Activation, activation) = Activation::kGelu;
  TORCH_ARG(torch::nn::AnyModule, shared_expert);  // empty: none
  TORCH_ARG(bool, shared_expert_overlap) = true;   // Megatron's moe_shared_expert_overlap
  TORCH_ARG(int64_t, latent_size) = 0;             // 0: the experts work in hidden_size
};

struct MoEOutput {
  at::Tensor output;
  at::Tensor l_aux;
  at::Tensor exp_counts;
};

// Work that MOELayer hands its dispatcher to run beside the exchanges (token_dispatcher.h).
struct BesideExchanges {
  Beside dispatch;  // while the dispatch's all-to-all is on the wire
  Beside combine;   // while the combine's is
};

// DeepSpeed's MOELayer: gate, dispatcher, experts on [S, H] tokens. tensor_group: the token
// split above (null: none), or with sequence_parallel the group whose shard the tokens are.
class MOELayerImpl : public torch::nn::Module, public nn::TensorParallelModule {
 public:
  MOELayerImpl(TopKGate gate, std::shared_ptr<torch::nn::Module> experts,
               std::unique_ptr<TokenDispatcher> dispatcher, GroupPtr tensor_group = nullptr,
               bool sequence_parallel = false);
  // tokens [S, H] -> ([S, H'], the routing). expert_tokens: what is dispatched (LatentMoE:
  // the down-projected tokens); undefined: `tokens` itself.
  std::pair<at::Tensor, Routing> forward(const at::Tensor& tokens, int64_t seq_length = 0,
                                         const at::Tensor& expert_tokens = {},
                                         const at::Tensor& used_token = {},
                                         const BesideExchanges& beside = {});
  // With the token split: every expert parameter is sequence_parallel (partial gradients over
  // the tensor group); with sequence parallelism the router's weight too; none otherwise.
  std::map<std::string, nn::TensorParallelAttr> tensor_parallel_attributes() const override;

  TopKGate gate{nullptr};
  std::shared_ptr<torch::nn::Module> experts;
  LocalExperts* local_experts = nullptr;
  std::unique_ptr<TokenDispatcher> dispatcher;
  GroupPtr tensor_group;           // the token split's (or the shard's) group; null: none
  bool sequence_parallel = false;  // the tokens are tensor_group's shard: no split
};
TORCH_MODULE(MOELayer);

class MoEImpl : public torch::nn::Module, public nn::TensorParallelModule {
 public:
  explicit MoEImpl(const MoEOptions& options);
  // used_token (DeepSpeed's, k = 1 only): [...] over hidden_states' tokens, 0 for a token
  // that is neither counted nor routed.
  MoEOutput forward(const at::Tensor& hidden_states, const at::Tensor& used_token = {});
  // With sequence parallelism: latent_down, latent_up, coefficient and mlp are
  // sequence_parallel (see above); none otherwise.
  std::map<std::string, nn::TensorParallelAttr> tensor_parallel_attributes() const override;

  MoEOptions options;
  MOELayer deepspeed_moe{nullptr};
  torch::nn::AnyModule mlp;                // use_residual
  torch::nn::Linear coefficient{nullptr};  // use_residual: [2, H]
  torch::nn::AnyModule shared_experts;
  torch::nn::Linear latent_down{nullptr}, latent_up{nullptr};  // latent_size
};
TORCH_MODULE(MoE);

}  // namespace dscpp::nn::moe
