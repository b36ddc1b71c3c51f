// The MoE router: see router.h. The capacity arithmetic and the drop rules run the same ATen
// operations as DeepSpeed's top1gating / top2gating / topkgating (torch.topk's choice among
// equal values included), so that the same logits keep the same tokens.
#include "dscpp/nn/moe/router.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/error.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/module_scope.h"
#include "dscpp/ops/moe_router.h"

namespace dscpp::nn::moe {

namespace {

void check_gate(bool ok, const std::string& what) {
  if (!ok) throw dscpp::Error("TopKGate: " + what);
}

void validate(const TopKGateOptions& o) {
  check_gate(o.model_dim() > 0, "model_dim must be positive, got " + std::to_string(o.model_dim()));
  check_gate(o.num_experts() > 0,
             "num_experts must be positive, got " + std::to_string(o.num_experts()));
  check_gate(o.k() >= 1 && o.k() <= o.num_experts(),
             "k must be in [1, num_experts = " + std::to_string(o.num_experts()) + "], got " +
                 std::to_string(o.k()));
  check_gate(o.capacity_factor() >= 0 && o.eval_capacity_factor() >= 0,
             "capacity_factor and eval_capacity_factor must be >= 0 (0: dropless)");
  check_gate(o.min_capacity() >= 0, "min_capacity must be >= 0");
  const std::string& p = o.noisy_gate_policy();
  check_gate(p.empty() || p == "None" || p == "Jitter" || p == "RSample",
             "noisy_gate_policy must be None, Jitter or RSample, got '" + p + "'");
  check_gate(p != "RSample" || o.k() == 1,
             "noisy_gate_policy RSample applies to k = 1 only (DeepSpeed's top1gating), got k = " +
                 std::to_string(o.k()));
  check_gate(o.z_loss_coeff() >= 0 && o.seq_aux_loss_coeff() >= 0,
             "z_loss_coeff and seq_aux_loss_coeff must be >= 0");
  check_gate(o.bias_update_rate() >= 0, "bias_update_rate must be >= 0");
  if (o.group_topk() > 0) {
    check_gate(o.num_groups() >= 1 && o.num_experts() % o.num_groups() == 0,
               "device-limited routing: num_experts (" + std::to_string(o.num_experts()) +
                   ") must divide into num_groups (" + std::to_string(o.num_groups()) + ") groups");
    check_gate(o.group_topk() <= o.num_groups(),
               "device-limited routing: group_topk (" + std::to_string(o.group_topk()) +
                   ") exceeds num_groups (" + std::to_string(o.num_groups()) + ")");
    check_gate(o.k() >= o.group_topk(), "device-limited routing: k (" + std::to_string(o.k()) +
                                            ") must be >= group_topk (" +
                                            std::to_string(o.group_topk()) + ")");
    check_gate(o.k() <= o.group_topk() * (o.num_experts() / o.num_groups()),
               "device-limited routing: k (" + std::to_string(o.k()) +
                   ") exceeds the experts of group_topk groups");
  } else {
    check_gate(o.group_topk() == 0, "group_topk must be >= 0 (0: unlimited)");
  }
}

// Gumbel(0, 1) noise: -log of an Exp(1) draw.
at::Tensor gumbel_like(const at::Tensor& t) {
  return at::empty_like(t).exponential_().log_().neg_();
}

// The experts outside each token's best group_topk groups masked to -inf in `t`.
at::Tensor group_mask(const at::Tensor& sel, const TopKGateOptions& o) {
  const int64_t s = sel.size(0), g = o.num_groups(), per = o.num_experts() / g;
  at::Tensor group_scores =
      std::get<0>(sel.view({s, g, per}).topk(o.k() / o.group_topk(), -1)).sum(-1);
  at::Tensor best = std::get<1>(group_scores.topk(o.group_topk(), -1, true, false));
  at::Tensor allowed = at::zeros({s, g}, sel.options().dtype(at::kBool)).scatter_(1, best, true);
  return allowed.unsqueeze(-1).expand({s, g, per}).reshape({s, o.num_experts()});
}

// DeepSpeed's _capacity: ceil(tokens / experts * factor) in fp32, at least min_capacity.
int64_t capacity_of(int64_t tokens, int64_t experts, double factor, int64_t min_capacity) {
  at::Tensor f = at::scalar_tensor(factor, at::kFloat);
  int64_t c = at::ceil(f * (static_cast<double>(tokens) / static_cast<double>(experts)))
                  .to(at::kLong)
                  .item<int64_t>();
  return std::max(c, min_capacity);
}

}  // namespace

TopKGateImpl::TopKGateImpl(const TopKGateOptions& options_) : options(options_) {
  validate(options);
  wg = register_module(
      "wg", torch::nn::Linear(
                torch::nn::LinearOptions(options.model_dim(), options.num_experts()).bias(false)));
  if (options.enable_expert_bias())
    expert_bias = register_buffer("expert_bias", at::zeros({options.num_experts()}, at::kFloat));
  tokens_per_expert_ = at::zeros({options.num_experts()}, at::kFloat);
}

Routing TopKGateImpl::forward(const at::Tensor& x, int64_t seq_length,
                              const at::Tensor& used_token) {
  nn::ModuleScope scope(*this);  // names it to the flops profiler (module_scope.h)
  const TopKGateOptions& o = options;
  check_gate(x.dim() == 2 && x.size(1) == o.model_dim(),
             "input must be [tokens, " + std::to_string(o.model_dim()) + "], got " +
                 std::to_string(x.dim()) + " dimensions");
  const int64_t s = x.size(0), e = o.num_experts(), k = o.k();
  const bool train = is_training();

  at::Tensor xf = x.to(at::kFloat);
  if (o.noisy_gate_policy() == "Jitter" && train)
    xf = xf * at::empty_like(xf).uniform_(1.0 - 1e-2, 1.0 + 1e-2);
  at::Tensor logits = nn::linear(xf, wg->weight.to(at::kFloat));
  const bool softmax = o.score_function() == ScoreFunction::kSoftmax;
  at::Tensor scores = softmax ? at::softmax(logits, 1) : at::sigmoid(logits);
  const double factor = train ? o.capacity_factor() : o.eval_capacity_factor();
  const bool dropless = !o.drop_tokens() || factor <= 0;

  Routing r;
  r.num_experts = e;
  r.logits = logits;
  at::Tensor ce;    // the aux loss's fraction of routes per expert (DeepSpeed's: first choices)
  at::Tensor mask;  // int64 (float with used_token) [S, E]: the chosen routes, where built
  // Where every route is kept and the choice is top-k of the selection scores (k = 1 with no
  // noise: DeepSpeed's argmax, the same expert), ops::moe_topk_route makes indices, weights
  // and counts in one kernel each way on a GPU; elsewhere DeepSpeed's operations follow.
  const bool rsample = o.noisy_gate_policy() == "RSample" && train;
  if (dropless && !used_token.defined() && o.group_topk() == 0 && o.seq_aux_loss_coeff() == 0 &&
      (k > 2 || (k == 1 && !rsample))) {
    ops::MoeTopK t =
        ops::moe_topk_route(scores, expert_bias, k, /*normalize=*/k > 1, o.topk_scaling_factor());
    r.indices = t.indices;
    r.weights = t.weights;
    r.exp_counts = t.counts;
    r.kept = at::ones({s, k}, logits.options().dtype(at::kBool));
    ce = t.counts.to(at::kFloat).div_(static_cast<double>(s));
  } else {
    route_with_masks(r, scores, used_token, dropless, factor, ce, mask);
  }

  // Sequence parallelism: the shard's counts summed over the group (router.h), in one
  // all-reduce: the aux loss's route counts, exp_counts and the per-sequence counts.
  const auto& group = o.sequence_partition_group();
  const int64_t t = group && group->size() > 1 ? group->size() : 1;
  const bool seq_aux = o.seq_aux_loss_coeff() > 0;
  int64_t b = 0;
  if (seq_aux) {
    check_gate(
        seq_length > 0 && s % seq_length == 0,
        "seq_aux_loss_coeff needs the sequence length of [batch, seq] tokens; got seq_length " +
            std::to_string(seq_length) + " for " + std::to_string(s) + " tokens");
    b = s / seq_length;  // (the kernel path leaves seq_aux_loss to this one)
  }
  at::Tensor seq_counts;  // fp32 [B, E]: each sequence's routes per expert (the group's)
  // [s, E] -> [B, E]: each sequence's sum over this shard's tokens of it.
  const bool sequence_major = o.sequence_major_shards();
  const auto per_sequence = [&](const at::Tensor& x) {
    return sequence_major ? x.view({seq_length, b, e}).sum(0) : x.view({b, seq_length, e}).sum(1);
  };
  if (t > 1) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> parts{ce.mul(static_cast<double>(s)).round_(),
                                  r.exp_counts.to(at::kFloat)};
    if (seq_aux) parts.push_back(per_sequence(mask.to(at::kFloat)).view({-1}));
    at::Tensor flat = at::cat(parts);
    group->all_reduce(flat).wait();
    ce = flat.narrow(0, 0, e).div(static_cast<double>(s * t));
    r.exp_counts = flat.narrow(0, e, e).round().to(at::kLong);
    if (seq_aux) seq_counts = flat.narrow(0, 2 * e, b * e).view({b, e});
  }

  // DeepSpeed's aux loss (its operation order); with sequence parallelism this shard's part:
  // its scores summed over the whole token count.
  at::Tensor p = softmax ? scores : scores / (scores.sum(1, true) + 1e-20);
  at::Tensor me = t > 1 ? p.sum(0).div(static_cast<double>(s * t)) : p.mean(0);
  if (k == 1)
    r.l_aux = (me * ce).sum() * static_cast<double>(e);
  else if (k == 2)
    r.l_aux = (me * ce).mean() * static_cast<double>(e) * static_cast<double>(e);
  else
    r.l_aux =
        (me * ce).mean() * static_cast<double>(e) * static_cast<double>(e) / static_cast<double>(k);
  if (o.z_loss_coeff() > 0)
    r.z_loss =
        at::logsumexp(logits, 1).square().mean() * (o.z_loss_coeff() / static_cast<double>(t));
  if (seq_aux) {
    if (t == 1) {
      at::Tensor cost = mask.to(at::kFloat).view({b, seq_length, e}).sum(1) /
                        (static_cast<double>(seq_length) * k / e);
      r.seq_aux_loss =
          (cost * p.view({b, seq_length, e}).mean(1)).sum(1).mean() * o.seq_aux_loss_coeff();
    } else {
      // A shard of each sequence: its whole counts, this shard's scores.
      const double whole = static_cast<double>(seq_length * t);
      at::Tensor cost = seq_counts / (whole * k / e);
      at::Tensor mean_p = per_sequence(p).div(whole);
      r.seq_aux_loss = (cost * mean_p).sum(1).mean() * o.seq_aux_loss_coeff();
    }
  }

  // A checkpointed block's recompute routes the same tokens again: counted once, in forward.
  if (train && !activation_checkpointing::recomputing()) {
    at::NoGradGuard no_grad;
    tokens_per_expert_ = tokens_per_expert_.to(r.exp_counts.device());
    tokens_per_expert_.add_(r.exp_counts.to(at::kFloat));
  }
  return r;
}

void TopKGateImpl::route_with_masks(Routing& r, const at::Tensor& scores,
                                    const at::Tensor& used_token, bool dropless, double factor,
                                    at::Tensor& ce, at::Tensor& mask) {
  const TopKGateOptions& o = options;
  const at::Tensor& logits = r.logits;
  const int64_t s = scores.size(0), e = o.num_experts(), k = o.k();
  const bool train = is_training();
  const bool softmax = o.score_function() == ScoreFunction::kSoftmax;

  // Selection: scores plus the bias, never differentiated.
  at::Tensor sel = scores.detach();
  if (expert_bias.defined()) sel = sel + expert_bias;
  at::Tensor allowed;
  if (o.group_topk() > 0) {
    allowed = group_mask(sel, o);
    sel = sel.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  }
  auto limit = [&](at::Tensor t) {
    if (expert_bias.defined()) t = t + expert_bias;
    return allowed.defined()
               ? t.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity())
               : t;
  };
  at::Tensor indices;
  at::Tensor mask1;  // int64 one-hot of the first choice
  if (k == 1) {
    at::Tensor base = (o.noisy_gate_policy() == "RSample" && train)
                          ? limit(logits.detach() + gumbel_like(logits))
                          : sel;
    indices = base.argmax(1, true);
    mask1 = at::one_hot(indices.squeeze(1), e);
  } else if (k == 2) {
    at::Tensor first = sel.argmax(1);
    mask1 = at::one_hot(first, e);
    // DeepSpeed picks the second from the logits (the same order as the softmax).
    at::Tensor base;
    if (o.top2_2nd_expert_sampling())
      base = limit(logits.detach() + gumbel_like(logits));
    else
      base = (softmax && !expert_bias.defined()) ? limit(logits.detach()) : sel;
    at::Tensor second =
        base.masked_fill(mask1.to(at::kBool), -std::numeric_limits<float>::infinity()).argmax(1);
    indices = at::stack({first, second}, 1);
  } else {
    indices = std::get<1>(sel.topk(k, 1));
  }
  mask = at::zeros({s, e}, logits.options().dtype(at::kLong)).scatter_(1, indices, 1);
  if (used_token.defined()) {
    check_gate(k == 1, "used_token applies to k = 1 only (DeepSpeed's top1gating), got k = " +
                           std::to_string(k));
    check_gate(used_token.dim() == 1 && used_token.size(0) == s,
               "used_token must be [tokens] = [" + std::to_string(s) + "]");
    // DeepSpeed's einsum("s,se->se", used_token, mask1): a float mask from here on.
    mask1 = mask1 * used_token.to(at::kFloat).unsqueeze(1);
    mask = mask1;
  }
  r.indices = indices;
  r.exp_counts = mask.sum(0).to(at::kLong);
  ce = (k <= 2 ? mask1 : mask).to(at::kFloat).mean(0);

  // Capacity and the tokens it drops.
  if (dropless) {
    r.kept = at::ones({s, k}, logits.options().dtype(at::kBool));
  } else {
    r.capacity = capacity_of(s, e, factor * static_cast<double>(k), o.min_capacity());
    const int64_t select = std::min(r.capacity, s);
    if (k == 1) {
      check_gate(s >= o.min_capacity(), "the number of tokens (" + std::to_string(s) +
                                            ") must be >= min_capacity (" +
                                            std::to_string(o.min_capacity()) + ") to drop tokens");
      at::Tensor ranked = o.use_rts() ? mask1 * at::rand({s, e}, logits.options()) : mask1;
      at::Tensor top = std::get<1>(ranked.topk(select, 0));
      at::Tensor keep = mask1 * at::zeros_like(mask1).scatter_(0, top, 1);
      r.kept = keep.gather(1, indices).gt(0);
    } else if (k == 2) {
      at::Tensor mask2 = mask - mask1;
      at::Tensor loc1 = mask1.cumsum(0) - 1;
      at::Tensor loc2 = mask2.cumsum(0) - 1 + mask1.sum(0, true);
      at::Tensor first = indices.narrow(1, 0, 1), second = indices.narrow(1, 1, 1);
      r.kept =
          at::cat({loc1.gather(1, first).lt(r.capacity), loc2.gather(1, second).lt(r.capacity)}, 1);
    } else {
      at::Tensor ranked = at::zeros({s, e}, logits.options())
                              .scatter(1, indices, scores.detach().gather(1, indices));
      at::Tensor top = std::get<1>(ranked.topk(select, 0, true, false));
      at::Tensor keep = at::zeros({s, e}, logits.options().dtype(at::kBool)).scatter_(0, top, true);
      r.kept = keep.gather(1, indices);
    }
  }

  if (used_token.defined()) r.kept = r.kept.logical_and(mask1.gather(1, indices).gt(0));

  at::Tensor g = scores.gather(1, indices) * r.kept.to(at::kFloat);
  if (k > 1) g = g / at::clamp_min(g.sum(1, true), std::numeric_limits<float>::epsilon());
  if (o.topk_scaling_factor() != 1.0) g = g * o.topk_scaling_factor();
  r.weights = g;
}

void TopKGateImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  // Module::to casts every buffer: keep the fp32 values (a cast back would keep bf16's rounding)
  // and put them back on the new device. set_data keeps the registered buffer's identity (the
  // state dict and the engine's buffer list hold this tensor), as Module::to does.
  const at::Tensor keep = expert_bias.defined() ? expert_bias.detach().clone() : at::Tensor();
  torch::nn::Module::to(device, dtype, non_blocking);
  if (keep.defined()) expert_bias.set_data(keep.to(expert_bias.device()));
}

void TopKGateImpl::to(torch::Dtype dtype, bool non_blocking) {
  const at::Tensor keep = expert_bias.defined() ? expert_bias.detach().clone() : at::Tensor();
  torch::nn::Module::to(dtype, non_blocking);
  if (keep.defined()) expert_bias.set_data(keep);
}

void TopKGateImpl::update_expert_bias(const std::shared_ptr<comm::ProcessGroup>& group) {
  if (!expert_bias.defined()) return;
  at::NoGradGuard no_grad;
  at::Tensor counts = tokens_per_expert_.to(expert_bias.device()).clone();
  if (group && group->size() > 1) group->all_reduce(counts).wait();
  expert_bias.add_(at::sign(counts.mean() - counts) * options.bias_update_rate());
  tokens_per_expert_.zero_();
}

void update_expert_biases(torch::nn::Module& module,
                          const std::shared_ptr<comm::ProcessGroup>& group) {
  for (const auto& m : module.modules())
    if (auto* gate = m->as<TopKGateImpl>()) gate->update_expert_bias(group);
}

}  // namespace dscpp::nn::moe
