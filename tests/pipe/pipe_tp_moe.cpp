// Experts in a pipeline with tensor parallelism (pipeline x tensor x experts), on real
// Gloo ranks: model_zoo's tensor_parallel_gpt_layer_specs with MoE blocks (tp_moe_common.h's tiny
// MoE GPT: hidden 64, 2 blocks both MoE, 4 experts of FFN 32, GPT-2's blocks) on P stages
// ("type:block": one MoE block per stage) x data d x tensor t, the expert-parallel groups of E
// ranks inside each stage and tensor rank's data group (comm::new_expert_groups on the pipe x
// data x model topology), trains, fp32, like the one-rank model: gpt_layer_specs at tensor 1,
// ep 1, one stage, from the same per-layer seeds, on the whole global batch (dropless routing,
// so every layout routes alike; each rank runs that reference too). Within 1e-5 relative: every
// batch's loss and gradient norm (gradient_clipping active: an expert counted t times, or a
// partial expert gradient left unsummed over the tensor group, changes the weights), then every
// weight against its slice of the reference's (the tensor slice of a split parameter, the
// expert-parallel rank's experts of a routed one); the experts must be equal on every tensor
// rank too. The engine must hold the experts apart (their own ZeroOptimizer over d / E ranks)
// at E > 1.
//   pipe_tp_moe --stages P --tensor T --case e<E>k<k>d1s<shared>z<stage>g<micro-batches> [...]
//               [--steps N] [--refusals]
// --refusals: what the LayerSpec form refuses by name. Exits 0 when every check holds on this
// rank; prints what failed otherwise.
#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/zero/zero_optimizer.h"
#include "tests/runtime/engine/tp_common.h"
#include "tests/runtime/engine/tp_moe_common.h"

using tp_test::check;
using tp_test::check_close;
namespace mz = dscpp::model_zoo;
namespace moe = dscpp::nn::moe;
namespace pipe = dscpp::pipe;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;
using namespace tp_moe_test;

namespace {

constexpr int64_t kSeed = 4321;

// The reference's tensor that the 3D model's `name` holds on this rank (tp_moe_engine's rule).
at::Tensor counterpart(const std::map<std::string, at::Tensor>& ref,
                       const std::map<std::string, moe::ExpertParam>& experts,
                       const std::map<std::string, dscpp::nn::TensorParallelAttr>& attrs,
                       const std::string& name, int tp_rank, int t) {
  const at::Tensor& whole = ref.at(name);
  auto e = experts.find(name);
  if (e != experts.end() && e->second.ep_size > 1)
    return whole.narrow(0, e->second.ep_rank * e->second.num_local_experts,
                        e->second.num_local_experts);
  auto a = attrs.find(name);
  if (a == attrs.end() || !a->second.tensor_model_parallel) return whole;
  return dscpp::nn::partition_of(whole, a->second.partition_dim, a->second.partition_stride,
                                 tp_rank, t);
}

std::map<std::string, at::Tensor> params_of(pipe::PipelineEngine& engine) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : engine.module().stage_module()->named_parameters()) out[p.key()] = p.value();
  return out;
}

struct Layout {
  std::shared_ptr<const pipe::ParallelGroups> groups;
  std::map<int, GroupPtr> ep;  // by expert degree
  GroupPtr self;
};

// Micro-batch m of step `step`'s global batch ([kMicro * d * micro-batches, kSeq + 1] tokens,
// the same on every rank): rows [first, first + rows) of it.
pipe::MicroBatch micro_batch(const at::Tensor& tokens, int64_t m, int64_t per_micro, int64_t first,
                             int64_t rows) {
  const at::Tensor part = tokens.narrow(0, m * per_micro + first, rows);
  return {{part.narrow(1, 0, kSeq).contiguous()}, part.narrow(1, 1, kSeq).contiguous()};
}

void run_case(const Layout& l, const Case& c, int steps) {
  const auto& g = *l.groups;
  const int rank = g.world->rank(), t = g.model_size, d = g.data_size;
  const std::string where = "case " + c.name + " p" + std::to_string(g.stages) + "t" +
                            std::to_string(t) + "d" + std::to_string(d) + ": ";
  if (!c.dropless) throw dscpp::Error(where + "the reference is the one-rank model: dropless only");
  if (c.ep > 1 && !l.ep.count(c.ep)) throw dscpp::Error(where + "no expert groups of that degree");

  // The reference: one rank, one stage, every global expert, the whole global batch.
  const mz::GPTConfig ref_config = moe_config(c, 1, 1);
  const bool fused = ref_config.cross_entropy_loss_fusion;
  auto ref_options =
      pipe::PipelineOptions(1).seed_layers(true).base_seed(kSeed).group(l.self).loss_fn(
          pipe::loss_of([fused](const at::Tensor& o, const at::Tensor& y) {
            return mz::gpt_loss(o, y, fused);
          }));
  auto ref = dscpp::initialize(pipe::PipelineModule(mz::gpt_layer_specs(ref_config), ref_options),
                               ds_config(kMicro * d, c, 0));
  const auto ref_params = params_of(ref);

  const GroupPtr model_group = g.model;
  auto options =
      pipe::PipelineOptions(g.stages)
          .groups(l.groups)
          .partition_method("type:block")
          .seed_layers(true)
          .base_seed(kSeed)
          .loss_fn(pipe::loss_of([model_group](const at::Tensor& o, const at::Tensor& y) {
            return mz::tensor_parallel_gpt_loss(o, y, model_group);
          }));
  pipe::PipelineModule module(
      mz::tensor_parallel_gpt_layer_specs(moe_config(c, t, c.ep), g.model,
                                          c.ep > 1 ? l.ep.at(c.ep) : nullptr),
      options);
  const auto experts = moe::expert_parameters(*module.stage_module());
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*module.stage_module());
  check(experts.size() == 2, where + "the stage holds one MoE block (its 2 expert weights)", rank);
  // (The last stage's copy of the tied embedding trains its word weight only: its position
  // embedding is frozen and unused, drawn from the head's seed. Compared: what trains.)
  double start = 0;
  for (const auto& p : module.stage_module()->named_parameters())
    if (p.value().requires_grad())
      start = std::max(start, tp_test::rel_err(p.value(), counterpart(ref_params, experts, attrs,
                                                                      p.key(), g.model_id, t)));
  check(start == 0, where + "starts from the reference's weights: " + std::to_string(start), rank);
  auto eng = dscpp::initialize(std::move(module), ds_config(kMicro, c, c.stage));
  dscpp::zero::ZeroOptimizer* ez = eng.core().expert_zero_optimizer();
  check((ez != nullptr) == (c.ep > 1), where + "the engine holds the experts apart at ep > 1",
        rank);
  if (ez)
    check(eng.core().expert_data_group()->size() == d / c.ep,
          where + "the expert-data group has d / ep ranks", rank);

  const int64_t per_micro = kMicro * d;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor tokens = tp_test::batch(step, per_micro * c.ga);
    int64_t m_ref = 0, m = 0;
    pipe::DataIter ref_iter = [&] { return micro_batch(tokens, m_ref++, per_micro, 0, per_micro); };
    pipe::DataIter iter = [&] {
      return micro_batch(tokens, m++, per_micro, int64_t{g.data_id} * kMicro, kMicro);
    };
    const double want = ref.train_batch(ref_iter).item<double>();
    const double got = eng.train_batch(iter).item<double>();
    check_close(got, want, where + "step " + std::to_string(step) + " loss", rank);
    const double n = eng.get_global_grad_norm(), n_ref = ref.get_global_grad_norm();
    check_close(n, n_ref, where + "step " + std::to_string(step) + " grad norm", rank);
    if (step == 0) check(n_ref > 0.5, where + "the clip is active (norm > 0.5)", rank);
  }
  double worst = 0, apart = 0;
  std::string worst_name;
  const auto final_ref = params_of(ref);
  for (const auto& p : eng.module().stage_module()->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    const double e =
        tp_test::rel_err(p.value(), counterpart(final_ref, experts, attrs, p.key(), g.model_id, t));
    if (e > worst) worst = e, worst_name = p.key();
    if (!experts.count(p.key()) || t == 1) continue;
    at::Tensor mine = p.value().detach().clone(), other = mine.clone();
    g.model->broadcast(other, 0).wait();
    apart = std::max(apart, (mine - other).abs().max().item<double>());
  }
  check(worst <= 1e-5, where + "weights: worst " + worst_name + " " + std::to_string(worst), rank);
  check(apart == 0, where + "the experts equal on every tensor rank: " + std::to_string(apart),
        rank);
  if (rank == 0)
    std::cout << where << "done, worst weight error " << worst << " (" << worst_name << ")\n";
}

// What the LayerSpec form refuses, by name, before any group is used.
void refusals(const Layout& l) {
  const auto& g = *l.groups;
  const int rank = g.world->rank();
  auto refused = [&](const std::string& what, const std::string& want, auto build) {
    try {
      build();
      check(false, what + ": accepted", rank);
    } catch (const dscpp::ConfigError& e) {
      check(std::string(e.what()).find(want) != std::string::npos,
            what + ": the refusal names " + want + ": " + e.what(), rank);
    }
  };
  Case c;
  mz::GPTConfig sp = moe_config(c, g.model_size, 2);
  sp.parallelism.sequence_parallel = true;
  refused("experts with sequence parallelism", "parallelism.sequence_parallel",
          [&] { mz::tensor_parallel_gpt_layer_specs(sp, g.model, l.ep.at(2)); });
  refused("an expert degree without its group", "parallelism.expert_model_parallel_size", [&] {
    mz::tensor_parallel_gpt_layer_specs(moe_config(c, g.model_size, 2), g.model, nullptr);
  });
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 2, t = 2, steps = 20;
  bool refuse = false;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--refusals") refuse = true;
    if (i + 1 >= argc) continue;
    const std::string value = argv[i + 1];
    if (flag == "--stages") stages = std::stoi(value);
    if (flag == "--tensor") t = std::stoi(value);
    if (flag == "--steps") steps = std::stoi(value);
    if (flag == "--case") cases.push_back(parse_case(value));
  }
  dscpp::comm::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(init);
  if (cases.empty() && !refuse) {
    std::cerr << "pipe_tp_moe: no --case given\n";
    return 2;
  }
  try {
    if (world->size() % (stages * t) != 0)
      throw dscpp::Error("pipe_tp_moe: the world does not divide into stages x tensor ranks");
    const int d = world->size() / (stages * t);
    // Every rank makes every group in the same order, whichever it uses.
    Layout l;
    const auto topo = pipe::pipe_model_data_topology(stages, t, d);
    l.groups = pipe::make_parallel_groups(world, topo);
    for (int ep = 2; ep <= d; ep *= 2)
      if (d % ep == 0) l.ep[ep] = dscpp::comm::new_expert_groups(*world, topo, ep).expert_parallel;
    for (int r = 0; r < world->size(); ++r)
      if (auto sub = world->new_subgroup({r})) l.self = sub;
    for (const Case& c : cases) run_case(l, c, steps);
    if (refuse) {
      if (!l.ep.count(2)) throw dscpp::Error("pipe_tp_moe --refusals: needs 2 data ranks");
      refusals(l);
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return tp_test::failures == 0 ? 0 : 1;
}
