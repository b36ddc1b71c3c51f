// ulysses_cli CASE.safetensors...: on each rank of a launched job (the world is the
// sequence-parallel group), runs DeepSpeed-Ulysses' attention as the GPT does it on each case
// ulysses_deepspeed_oracle.py writes: this rank's slice of the sequence of q [B, S, Hq, d] and
// k, v [B, S, Hkv, d] (DeepSpeed's batch-first layout, float64), the all-to-alls of
// nn/tensor_parallel_mappings.h around causal SDPA (enable_gqa), then backward with grad_out's
// slice. Writes CASE.rank<R>.safetensors: out and the gradients of q, k and v (this rank's
// slice, in the case's layout), and hq, hk, hv: the heads this rank attended over, whole
// sequence.
#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <string>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/tensor_parallel_mappings.h"
#include "dscpp/runtime/checkpoint/safetensors.h"

using dscpp::checkpoint::load_safetensors;
using dscpp::checkpoint::save_safetensors;

namespace {

void run_case(const std::string& path, const std::shared_ptr<dscpp::comm::ProcessGroup>& group) {
  auto file = load_safetensors(path);
  std::map<std::string, at::Tensor> in(file.tensors.begin(), file.tensors.end());
  const int64_t p = group->size(), s = in.at("q").size(1), slice = s / p;
  // [B, S, H, d] -> this rank's [B, H, S/p, d], a leaf.
  auto mine = [&](const at::Tensor& t) {
    return t.narrow(1, group->rank() * slice, slice).transpose(1, 2).contiguous().requires_grad_();
  };
  at::Tensor q = mine(in.at("q")), k = mine(in.at("k")), v = mine(in.at("v"));
  // The split follows the key/value heads, as DeepSpeed's (uneven where p does not divide them).
  const int64_t kv_heads = k.size(1);
  auto heads = [&](const at::Tensor& t) {
    return dscpp::nn::all_to_all_sequence_to_heads(t, group, kv_heads);
  };
  const at::Tensor hq = heads(q), hk = heads(k), hv = heads(v);
  at::Tensor y =
      at::scaled_dot_product_attention(hq, hk, hv, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                       /*enable_gqa=*/q.size(1) != k.size(1));
  at::Tensor out = dscpp::nn::all_to_all_heads_to_sequence(y, group, kv_heads);
  out.backward(mine(in.at("grad_out")).detach());
  auto back = [](const at::Tensor& t) { return t.transpose(1, 2).contiguous(); };
  const std::string stem = path.substr(0, path.size() - std::string(".safetensors").size());
  save_safetensors({{"out", back(out.detach())},
                    {"dq", back(q.grad())},
                    {"dk", back(k.grad())},
                    {"dv", back(v.grad())},
                    {"hq", back(hq.detach())},
                    {"hk", back(hk.detach())},
                    {"hv", back(hv.detach())}},
                   stem + ".rank" + std::to_string(group->rank()) + ".safetensors");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto group = dscpp::comm::init_distributed();
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg.rfind("--local_rank", 0) != 0) run_case(arg, group);  // (the launcher's flag)
    }
  } catch (const std::exception& e) {
    std::cerr << "ulysses_cli: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
