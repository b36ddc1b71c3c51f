// Shared by the multi-rank MoE tests that train an expert-parallel model against a reference
// (tests/runtime/engine/moe_engine.cpp on the engine, tests/pipe/pipe_moe.cpp on a pipeline):
// the per-rank checks (rank_checks.h), the case string both take on their command line, the tiny
// MoE layer (also tests/nn/moe_ep_layer.cpp's) and ds_config both train, and where an
// expert-parallel rank's parameter stands in the reference. Header-only, test code.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>
#include <torch/ordered_dict.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/comm/process_group.h"
#include "dscpp/error.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/moe.h"
#include "tests/rank_checks.h"

namespace moe_test {

namespace moe = dscpp::nn::moe;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

constexpr int64_t kHidden = 16, kLatent = 8, kFfn = 32, kExperts = 8;

using rank_checks::check, rank_checks::check_close, rank_checks::failures, rank_checks::rel_err;

// One case of a test's command line: letters, each followed by a whole number of at most four
// digits, e.g. "e2k1d1s0z0c0g1". A test names the letters it takes, in their order (every one
// is required, nothing may follow); the fields of the others keep their defaults.
struct Case {
  int ep = 2;            // e: expert-parallel degree
  int k = 1;             // k: top-k
  bool dropless = true;  // d: 1 dropless, 0 capacity factor 0.5 with l_aux in the loss
  bool shared = false;   // s: a shared expert beside the routed ones
  int stage = 0;         // z: ZeRO stage
  bool clones = false;   // c: experts as clones of one module (else the grouped experts)
  int ga = 1;            // g: gradient accumulation steps
  bool latent = false;   // l: LatentMoE, the experts working in kLatent
  std::string name;      // the string itself, for messages
};

inline Case parse_case(const std::string& s, const std::string& letters,
                       const std::string& program) {
  static const std::map<char, std::string> kWhat = {
      {'e', "<E>"},     {'k', "<k>"},   {'d', "<0|1>"}, {'s', "<0|1>"},
      {'z', "<stage>"}, {'c', "<0|1>"}, {'g', "<ga>"},  {'l', "<0|1>"}};
  std::string form;
  for (char l : letters) form += l + kWhat.at(l);
  const dscpp::Error bad(program + ": bad case '" + s + "' (" + form + ")");
  Case c;
  c.name = s;
  size_t pos = 0;
  for (char l : letters) {
    if (pos >= s.size() || s[pos] != l) throw bad;
    const size_t first = ++pos;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) ++pos;
    if (pos == first || pos - first > 4) throw bad;
    const int v = std::stoi(s.substr(first, pos - first));
    switch (l) {
      case 'e':
        c.ep = v;
        break;
      case 'k':
        c.k = v;
        break;
      case 'd':
        c.dropless = v != 0;
        break;
      case 's':
        c.shared = v != 0;
        break;
      case 'z':
        c.stage = v;
        break;
      case 'c':
        c.clones = v != 0;
        break;
      case 'g':
        c.ga = v;
        break;
      case 'l':
        c.latent = v != 0;
        break;
    }
  }
  if (pos != s.size()) throw bad;
  return c;
}

// The tests' MoE layer: kExperts experts of kHidden -> kFfn -> kHidden (kLatent -> kFfn ->
// kLatent with c.latent) at expert degree `ep` on ep_group (unused at 1); dropless or capacity
// factor 0.5 (min 2); routing without random token selection or a sampled second expert, so
// that every layout routes alike.
inline moe::MoEOptions moe_options(const Case& c, int ep, const GroupPtr& ep_group) {
  auto o = moe::MoEOptions(kHidden)
               .num_experts(kExperts)
               .ep_size(ep)
               .ep_group(ep > 1 ? ep_group : nullptr)
               .k(c.k)
               .capacity_factor(c.dropless ? 0.0 : 0.5)
               .min_capacity(2)
               .use_rts(false)
               .top2_2nd_expert_sampling(false)
               .ffn_hidden_size(kFfn);
  const int64_t width = c.latent ? kLatent : kHidden;  // what the experts work in
  if (c.latent) o.latent_size(kLatent);
  if (c.clones) o.expert(torch::nn::AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(width, kFfn))));
  if (c.shared)
    o.shared_expert(torch::nn::AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(kHidden, kFfn))));
  return o;
}

inline nlohmann::json ds_config(int micro, int ga, int stage, bool overlap_comm) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", ga},
          // SGD with momentum: Adam would turn rounding noise of a zero gradient into steps.
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.9}}}}},
          {"gradient_clipping", 0.05},  // active every step: the norm reaches the weights
          {"zero_optimization",
           {{"stage", stage}, {"overlap_comm", overlap_comm}, {"reduce_bucket_size", 3000}}},
          {"steps_per_print", 0}};
}

// The reference's tensor that the EP model's `name` holds (on its expert-parallel rank): the
// same name, or the matching global expert's (a clone's index, or a slice of the stacked
// weights).
inline at::Tensor counterpart(const std::map<std::string, at::Tensor>& ref,
                              const std::map<std::string, moe::ExpertParam>& experts,
                              const std::string& name) {
  auto it = experts.find(name);
  if (it == experts.end() || it->second.ep_size == 1) return ref.at(name);
  const auto& e = it->second;
  const int64_t first = e.ep_rank * e.num_local_experts;
  if (e.local_expert < 0) return ref.at(name).narrow(0, first, e.num_local_experts);
  const std::string key = "deepspeed_experts.";
  const size_t at_ = name.find(key) + key.size(), dot = name.find('.', at_);
  return ref.at(name.substr(0, at_) + std::to_string(first + e.local_expert) + name.substr(dot));
}

// Every weight of the EP model (whole values: gathered first at stage 3) within 1e-5 relative
// of its counterpart; rank 0 prints the worst.
inline void check_weights(const torch::OrderedDict<std::string, at::Tensor>& params,
                          const std::map<std::string, at::Tensor>& ref,
                          const std::map<std::string, moe::ExpertParam>& experts,
                          const std::string& where, int rank) {
  double worst = 0;
  std::string worst_name;
  for (const auto& p : params) {
    const double e = rel_err(p.value(), counterpart(ref, experts, p.key()));
    if (e > worst) worst = e, worst_name = p.key();
  }
  check(worst <= 1e-5, where + "weights: worst " + worst_name + " " + std::to_string(worst), rank);
  if (rank == 0)
    std::cout << where << "done, worst weight error " << worst << " (" << worst_name << ")\n";
}

}  // namespace moe_test
