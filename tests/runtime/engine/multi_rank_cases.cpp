// Engine behaviours that need several ranks, run by the launcher
// (tests/runtime/engine/CMakeLists.txt):
//  - stage 3's GatheredParameters with a modifier rank: what that rank writes in the scope is
//    every rank's value afterwards (in the next gather and in training);
//  - checkpoint.tag_validation: ranks saving under different tags fail together with "FAIL"
//    (no rank left waiting), and save with a warning under "WARN";
//  - save_16bit_model at stage 3: refused (false, no file) without
//    stage3_gather_16bit_weights_on_model_save; with it, the file holds the gathered weights;
//  - the modifier rank's change with the parameters in NVMe swap files (offload_param nvme):
//    it reaches every rank's swapped chunks.
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "dscpp/dscpp.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/zero_optimizer.h"

using nlohmann::json;

namespace {

int failures = 0;
void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::cerr << "rank " << rank << ": FAILED: " << what << "\n";
    ++failures;
  }
}

json config(int stage, const char* tag_validation) {
  return {{"train_batch_size", 4},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
          {"zero_optimization", {{"stage", stage}}},
          {"checkpoint", {{"tag_validation", tag_validation}}}};
}

// The same value on every rank: max and min over the group agree.
bool same_everywhere(dscpp::comm::ProcessGroup& g, at::Tensor t) {
  at::Tensor hi = t.clone(), lo = -t;
  g.all_reduce(hi, dscpp::comm::ReduceOp::kMax).wait();
  g.all_reduce(lo, dscpp::comm::ReduceOp::kMax).wait();
  return at::equal(hi, -lo);
}

}  // namespace

int main() try {
  torch::manual_seed(0);
  torch::nn::Linear net(4, 3);
  auto engine = dscpp::initialize(net, config(3, "FAIL"));
  const int rank = engine.global_rank();
  auto& zo = engine.core().zero_optimizer();
  auto& group = engine.data_parallel_group();

  check(zo.params_numel_held() == 0, "stage 3 parameters are empty at rest", rank);
  {
    auto edit = engine.gathered_parameters({net->weight, net->bias}, /*modifier_rank=*/1);
    at::NoGradGuard no_grad;
    if (rank == 1) net->weight.fill_(0.5);  // only rank 1 changes it
  }
  {
    dscpp::zero::GatheredParameters all(zo);
    check(at::all(net->weight == 0.5).item<bool>(), "rank 1's change reached this rank", rank);
    check(same_everywhere(group, net->weight.detach().clone()), "weights agree across ranks", rank);
  }
  // Training computes with the changed weights on every rank.
  at::Tensor x = at::ones({2, 4}).to(engine.device());
  at::Tensor out = engine.forward(x);
  check(same_everywhere(group, out.detach().clone()), "forward agrees across ranks", rank);
  engine.backward(out.square().mean());
  engine.step();

  // tag_validation FAIL: different tags on the ranks are an error on every rank.
  const auto dir =
      std::filesystem::temp_directory_path() / ("dscpp_multi_rank_" + std::to_string(::getppid()));
  bool failed = false;
  try {
    engine.save_checkpoint(dir.string(), "tag_of_rank_" + std::to_string(rank));
  } catch (const dscpp::checkpoint::CheckpointError& e) {
    failed = std::string(e.what()).find("is not the same on every rank") != std::string::npos;
  }
  check(failed, "different tags fail the save under tag_validation FAIL", rank);
  check(!dscpp::checkpoint::read_latest(dir.string()), "no 'latest' after the refused save", rank);
  // The same tag everywhere saves.
  engine.save_checkpoint(dir.string(), "agreed");
  check(dscpp::checkpoint::read_latest(dir.string()) == std::string("agreed"),
        "an agreed tag saves", rank);

  // save_16bit_model: this engine's config leaves stage3_gather_16bit_weights_on_model_save off.
  const auto dir16 = dir / "model16";
  check(!engine.save_16bit_model(dir16.string()), "save_16bit_model refused without the flag",
        rank);
  check(!std::filesystem::exists(dir16 / "pytorch_model.bin"), "no file without the flag", rank);
  torch::nn::Linear net2(4, 3);
  json cfg2 = config(3, "FAIL");
  cfg2["bf16"] = {{"enabled", true}};
  cfg2["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = true;
  dscpp::InitArgs same_group;
  same_group.group = group.shared_from_this();
  auto engine2 = dscpp::initialize(net2, cfg2, same_group);
  check(engine2.save_16bit_model(dir16.string(), "model.bin"), "save_16bit_model with the flag",
        rank);
  {
    dscpp::zero::GatheredParameters all(engine2.core().zero_optimizer());  // collective
    auto sd = dscpp::checkpoint::PyValue::dict();
    if (rank == 0) sd = dscpp::checkpoint::load_torch_file((dir16 / "model.bin").string());
    for (const char* name : {"weight", "bias"}) {
      if (rank != 0) break;
      const auto* v = sd.find(dscpp::checkpoint::PyValue(name));
      check(v && v->is_tensor(), std::string("the 16-bit file holds ") + name, rank);
      if (!v || !v->is_tensor()) continue;
      const at::Tensor& t = v->as_tensor();
      const at::Tensor& p = std::string(name) == "weight" ? net2->weight : net2->bias;
      check(t.scalar_type() == at::kBFloat16 && at::equal(t, p.detach().cpu()),
            std::string("the saved ") + name + " is the gathered bf16 value", rank);
    }
  }
  {
    const auto swap = dir / "nvme";
    std::filesystem::create_directories(swap);
    group.barrier().wait();
    torch::nn::Linear net3(4, 3);
    json cfg3 = config(3, "FAIL");
    cfg3["zero_optimization"]["offload_param"] = {
        {"device", "nvme"}, {"nvme_path", swap.string()}, {"buffer_count", 1}, {"max_in_cpu", 0}};
    auto engine3 = dscpp::initialize(net3, cfg3, same_group);
    auto& zo3 = engine3.core().zero_optimizer();
    check(zo3.param_store().swapper() != nullptr && zo3.param_store().resident16_numel() == 0,
          "offload_param nvme keeps the chunks in files", rank);
    {
      auto edit = engine3.gathered_parameters({net3->weight, net3->bias}, /*modifier_rank=*/1);
      at::NoGradGuard no_grad;
      if (rank == 1) net3->bias.fill_(0.25);
    }
    dscpp::zero::GatheredParameters all(zo3);
    check(at::all(net3->bias == 0.25).item<bool>(), "rank 1's change reached the swap files", rank);
    check(same_everywhere(group, net3->weight.detach().clone()), "swapped weights agree", rank);
  }
  group.barrier().wait();
  if (rank == 0) std::filesystem::remove_all(dir);
  if (failures == 0 && rank == 0) std::cout << "multi_rank_cases: all checks passed\n";
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "multi_rank_cases: " << e.what() << "\n";
  return 1;
}
