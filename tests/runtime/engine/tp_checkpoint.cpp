// Tensor-parallel checkpoints across degrees, on 4 Gloo ranks (the launcher): TensorParallelGPT
// at tensor 2 x data 2 (SGD with momentum, clipping) trains 5 steps and saves (mp_rank_00/01
// model states, zero_pp_rank_D_mp_rank_XX files); the checkpoint then loads into the plain
// one-rank GPT engine (tensor 1 x data 1, ZeRO 0), the GPT at tensor 1 x data 4 and
// TensorParallelGPT at tensor 4 x data 1, and each continues 5 steps as the one-rank run of 10
// steps does: every step's loss and the final weights (as slices) within 1e-5 relative,
// optimizer state included (momentum carries over). Two rounds: saved at ZeRO 1 (loaded at t1d4
// ZeRO 2 and t4d1 ZeRO 3) and at ZeRO 3 (loaded at t1d4 ZeRO 3 and t4d1 ZeRO 1): at stage 3 the
// parameters' values are in the ZeRO files only. zero_to_fp32 and to_universal of each checkpoint
// give the weights the one-rank engine loaded, bit for bit.
//   tp_checkpoint --dir DIR [--saved-stage 1|3 ...]   (default: both rounds)
#include <ATen/ATen.h>

#include <array>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/checkpoint/fp32_state.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "tests/runtime/engine/tp_common.h"

using nlohmann::json;
using tp_test::check;
namespace mz = dscpp::model_zoo;

namespace {

constexpr int kRows = 8, kSteps = 5;

json ds_config(int micro, int stage) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}}},
          {"gradient_clipping", 0.5},
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20000}}},
          {"steps_per_print", 0}};
}

// Trains steps [first, last) on this data rank's rows; the loss averaged over the data group.
template <typename Engine, typename Model>
std::vector<double> train(Engine& eng, Model& model, const tp_test::Groups& g, int first,
                          int last) {
  std::vector<double> losses;
  const int micro = kRows / g.d;
  for (int step = first; step < last; ++step) {
    const at::Tensor mine =
        tp_test::batch(step, kRows).narrow(0, int64_t{g.dp_rank} * micro, micro);
    at::Tensor loss = model->loss(eng.forward(mine.narrow(1, 0, 16)), mine.narrow(1, 1, 16));
    eng.backward(loss);
    eng.step();
    at::Tensor mean = loss.detach().clone();
    if (g.data) g.data->all_reduce(mean).wait();
    losses.push_back(mean.item<double>() / g.d);
  }
  return losses;
}

void compare(const std::string& where, const std::vector<double>& got,
             const std::vector<double>& want, int rank) {
  for (size_t i = 0; i < want.size(); ++i)
    check(i < got.size() && std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]),
          where + ": step " + std::to_string(kSteps + i) + " loss " +
              (i < got.size() ? std::to_string(got[i]) : "missing") + " vs " +
              std::to_string(want[i]),
          rank);
}

template <typename Engine, typename Model>
void compare_weights(Engine& eng, const std::string& where, Model& model, mz::GPT& ref, int t,
                     int tp_rank, int rank) {
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*model);
  const auto ref_params = ref->named_parameters();
  std::vector<at::Tensor> params;  // stage 3: gathered whole for the comparison
  for (const auto& p : model->named_parameters()) params.push_back(p.value());
  auto gathered = eng.gathered_parameters(params);
  double worst = 0;
  for (const auto& p : model->named_parameters()) {
    const auto& a = attrs.at(p.key());
    const at::Tensor& whole = ref_params[p.key()];
    const at::Tensor want =
        a.tensor_model_parallel
            ? dscpp::nn::partition_of(whole, a.partition_dim, a.partition_stride, tp_rank, t)
            : whole;
    worst = std::max(worst, tp_test::rel_err(p.value(), want));
  }
  check(worst <= 1e-5, where + ": weights, worst " + std::to_string(worst), rank);
}

// zero_to_fp32 and to_universal on the t2d2 checkpoint (files only): the one-rank model's
// weights as the one-rank engine `m` loaded them (it then trains on as the one-rank run does),
// bit for bit; the universal files record how each tensor was cut: QKV along dim 0 in its 3
// fused parts, the attention projection along dim 1, LayerNorm replicated, all over 2 ranks.
void check_consolidation(const std::string& dir, mz::GPT& m, int rank) {
  namespace ck = dscpp::checkpoint;
  const ck::PyValue sd = ck::get_fp32_state_dict_from_zero_checkpoint(dir);
  const ck::UniversalCheckpoint u = ck::universal_from_zero_checkpoint(dir);
  std::map<std::string, const ck::UniversalParam*> by_name;
  for (const auto& p : u.params) by_name[p.name] = &p;
  size_t n = 0;
  for (const auto& p : m->named_parameters()) {
    const ck::PyValue* v = sd.find(ck::PyValue(p.key()));
    check(v && v->is_tensor() && at::equal(v->as_tensor(), p.value()),
          "zero_to_fp32 of t2d2: " + p.key() + " is the loaded one-rank weight", rank);
    auto it = by_name.find(p.key());
    check(it != by_name.end() && at::equal(it->second->fp32, p.value()),
          "to_universal of t2d2: " + p.key() + " whole", rank);
    if (it == by_name.end()) continue;
    ++n;
    const ck::ParamPartition& part = it->second->partition;
    const std::string& k = p.key();
    auto ends = [&](const std::string& tail) {
      return k.size() >= tail.size() && k.compare(k.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends("attn.qkv.weight"))
      check(part.tp_degree == 2 && part.partition_dim == 0 && part.sub_param_sizes.size() == 3 &&
                part.logical_shape == p.value().sizes().vec(),
            "to_universal: " + k + " cut along 0 in 3 fused parts over 2 ranks", rank);
    if (ends("attn.proj.weight"))
      check(part.partition_dim == 1, "to_universal: " + k + " cut along 1", rank);
    if (ends("ln_1.weight")) check(!part.partition_dim, "to_universal: " + k + " replicated", rank);
  }
  check(n == u.params.size() && n > 0, "to_universal: every parameter once", rank);
}

// One round: tensor 2 x data 2 at ZeRO `saved` trains 5 steps and saves into dir; the
// checkpoint loads into the plain one-rank engine (ZeRO 0), the GPT at tensor 1 x data 4 (ZeRO
// `at[0]`) and TensorParallelGPT at tensor 4 x data 1 (ZeRO `at[1]`), each continuing as the
// one-rank run does.
void round(const std::string& dir, int saved, std::array<int, 2> at, mz::GPT& ref,
           const std::vector<double>& ref_losses, dscpp::comm::ProcessGroup& world) {
  const int rank = world.rank();
  const auto g2 = tp_test::make_groups(world, 2), g4 = tp_test::make_groups(world, 4),
             g1 = tp_test::make_groups(world, 1);
  tp_test::Groups self;
  self.data = g1.self;
  const std::string z = "z" + std::to_string(saved) + " ";
  {  // tensor 2 x data 2 trains 5 steps and saves
    at::manual_seed(1);
    mz::TensorParallelGPT m(tp_test::tiny(2, false), g2.model);
    dscpp::InitArgs a;
    a.group = g2.data;
    a.model_group = g2.model;
    auto eng = dscpp::initialize(m, ds_config(kRows / 2, saved), std::move(a));
    (void)train(eng, m, g2, 0, kSteps);
    eng.save_checkpoint(dir);
    namespace fs = std::filesystem;
    const std::string tag = dir + "/global_step5/";
    check(fs::exists(tag + "mp_rank_00_model_states.pt") &&
              fs::exists(tag + "mp_rank_01_model_states.pt") &&
              fs::exists(tag + "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
          z + "t2d2 save: Megatron-DeepSpeed's file names", rank);
  }
  {                      // -> the plain one-rank engine
    at::manual_seed(2);  // other initial weights: the load must replace them
    mz::GPT m(tp_test::tiny(1, false));
    dscpp::InitArgs a;
    a.group = self.data;
    auto eng = dscpp::initialize(m, ds_config(kRows, 0), std::move(a));
    eng.load_checkpoint(dir);
    check(eng.global_steps() == kSteps, z + "t1d1: the step count restored", rank);
    if (rank == 0) check_consolidation(dir, m, rank);
    compare(z + "t2d2 -> t1d1", train(eng, m, self, kSteps, 2 * kSteps), ref_losses, rank);
    compare_weights(eng, z + "t2d2 -> t1d1", m, ref, 1, 0, rank);
  }
  {  // -> tensor 1 x data 4
    at::manual_seed(2);
    mz::GPT m(tp_test::tiny(1, false));
    dscpp::InitArgs a;
    a.group = g1.data;
    auto eng = dscpp::initialize(m, ds_config(kRows / 4, at[0]), std::move(a));
    eng.load_checkpoint(dir);
    const std::string where = z + "t2d2 -> t1d4 z" + std::to_string(at[0]);
    compare(where, train(eng, m, g1, kSteps, 2 * kSteps), ref_losses, rank);
    compare_weights(eng, where, m, ref, 1, 0, rank);
  }
  {  // -> tensor 4 x data 1
    at::manual_seed(2);
    mz::TensorParallelGPT m(tp_test::tiny(4, false), g4.model);
    dscpp::InitArgs a;
    a.group = g4.data;
    a.model_group = g4.model;
    auto eng = dscpp::initialize(m, ds_config(kRows, at[1]), std::move(a));
    eng.load_checkpoint(dir);
    const std::string where = z + "t2d2 -> t4d1 z" + std::to_string(at[1]);
    compare(where, train(eng, m, g4, kSteps, 2 * kSteps), ref_losses, rank);
    compare_weights(eng, where, m, ref, 4, g4.tp_rank, rank);
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::vector<int> stages;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--dir") dir = argv[i + 1];
    if (std::string(argv[i]) == "--saved-stage") stages.push_back(std::stoi(argv[i + 1]));
  }
  if (stages.empty()) stages = {1, 3};
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  const int rank = world->rank();
  try {
    if (dir.empty() || world->size() != 4) throw dscpp::Error("usage: 4 ranks, --dir DIR");
    const auto g1 = tp_test::make_groups(*world, 1);
    tp_test::Groups self;
    self.data = g1.self;

    // The one-rank run of 10 steps, on every rank.
    at::manual_seed(1);
    mz::GPT ref(tp_test::tiny(1, false));
    dscpp::InitArgs ra;
    ra.group = self.data;
    auto ref_eng = dscpp::initialize(ref, ds_config(kRows, 0), std::move(ra));
    (void)train(ref_eng, ref, self, 0, kSteps);
    const auto ref_losses = train(ref_eng, ref, self, kSteps, 2 * kSteps);

    for (int saved : stages) {
      // Saved at stage 1: loads at stage 2 (t1d4) and 3 (t4d1); at stage 3: at stage 3 (t1d4)
      // and 1 (t4d1); each also at stage 0 (t1d1). So every pairing of stage 3 or not on either
      // side, with and without tensor parallelism in the loading engine.
      const std::array<int, 2> at =
          saved == 3 ? std::array<int, 2>{3, 1} : std::array<int, 2>{2, 3};
      round(dir + "/z" + std::to_string(saved), saved, at, ref, ref_losses, *world);
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  if (rank == 0 && tp_test::failures == 0) std::cout << "tp_checkpoint: all passed\n";
  return tp_test::failures == 0 ? 0 : 1;
}
