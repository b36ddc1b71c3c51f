// MoE on a pipeline (pipe/pipeline_engine.h with runtime/engine/engine_experts.h), on 4 Gloo ranks
// = 2 stages x 2 data ranks, expert parallelism 2 inside each stage's data group (DeepSpeed's
// groups: comm::new_expert_groups on the pipe x data topology). The model: 6 LayerSpecs, hidden
// 16 (linear, MoE, linear | linear, MoE, linear; "uniform" puts one MoE layer on each stage),
// 8 experts, seeded per layer (seed_layers), fp32, SGD with momentum, gradient clipping active
// every step (an expert counted twice in the norm, or averaged over the wrong group, moves the
// weights). Compared within 1e-5 relative over --steps batches of 4 micro-batches: every batch's
// loss and gradient norm, then every weight (an expert's against the matching global expert).
//   - dropless: against one rank with the same global batch (each rank runs that one-stage,
//     one-rank pipeline too, holding every expert). No l_aux in the loss (it is each rank's own).
//   - token dropping (capacity factor 0.5, 0.01 l_aux through the aux-loss channel): against
//     expert parallelism 1 on the same layout (capacity and l_aux are per rank, DeepSpeed's).
// Both models are built from the same per-layer seeds and must start equal: the EP stage's
// experts are the reference's (drawn by global expert id, or clones of one module), bit for bit.
// Also: the engine found the experts (its expert optimizer over data / ep ranks). Checkpoints of
// such a pipeline: pipe_moe_checkpoint_oracle.py.
//   pipe_moe --case k<k>d<dropless>z<stage>c<clones> [--case ...] [--steps N] [--schedule S]
// --schedule: the expert-parallel pipeline's pipeline.schedule (zb-h1: the experts' grouped
// products and the clones' linears put their weight products off to W); the references 1F1B.
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/zero/zero_optimizer.h"
#include "tests/moe_test_util.h"

using nlohmann::json;
namespace moe = dscpp::nn::moe;
namespace pipe = dscpp::pipe;
using moe_test::Case, moe_test::check, moe_test::check_close, moe_test::counterpart,
    moe_test::GroupPtr, moe_test::kExperts, moe_test::kHidden, moe_test::moe_options;

namespace {

constexpr int64_t kMicro = 2, kSeq = 6;
constexpr int kStages = 2, kData = 2, kEp = 2, kMicroBatches = 4;

// The 6 layers; the MoE ones at expert degree ep on ep_group (null at 1).
std::vector<dscpp::nn::LayerSpec> specs(const Case& c, int ep, const GroupPtr& ep_group) {
  std::vector<dscpp::nn::LayerSpec> out;
  auto linear = [&out](int i, bool last) {
    out.push_back({"layers." + std::to_string(i),
                   [] { return torch::nn::Linear(kHidden, kHidden).ptr(); },
                   [last](torch::nn::Module& m, const at::Tensor& x) {
                     at::Tensor y = static_cast<torch::nn::LinearImpl&>(m).forward(x);
                     return last ? y : at::tanh(y);
                   },
                   "",
                   {}});
  };
  const double aux_coeff = c.dropless ? 0.0 : 0.01;
  auto moe_layer = [&](int i) {
    out.push_back({"layers." + std::to_string(i),
                   [c, ep, ep_group] { return moe::MoE(moe_options(c, ep, ep_group)).ptr(); },
                   [aux_coeff](torch::nn::Module& m, const at::Tensor& x) {
                     auto y = static_cast<moe::MoEImpl&>(m).forward(x);
                     if (aux_coeff != 0 && m.is_training())
                       dscpp::nn::add_aux_loss(aux_coeff * y.l_aux);
                     return y.output + x;
                   },
                   "",
                   {}});
  };
  linear(0, false);
  moe_layer(1);
  linear(2, false);
  linear(3, false);
  moe_layer(4);
  linear(5, true);
  return out;
}

json ds_config(int micro, const Case& c) {
  return moe_test::ds_config(micro, kMicroBatches, c.stage, c.stage == 2);
}

// Micro-batch m of step `step` of the global batch: [kMicro * kData, kSeq, kHidden] inputs and
// targets, the same on every rank; `rows` of them from row `first`.
pipe::MicroBatch batch(int step, int m, int64_t first, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(1000 + 100 * step + m);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor x = at::randn({kMicro * kData, kSeq, kHidden}, gen, f32);
  at::Tensor y = at::randn({kMicro * kData, kSeq, kHidden}, gen, f32);
  return {{x.narrow(0, first, rows)}, y.narrow(0, first, rows)};
}

std::map<std::string, at::Tensor> params_of(pipe::PipelineEngine& engine) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : engine.module().stage_module()->named_parameters()) out[p.key()] = p.value();
  return out;
}

pipe::LossFn mse() {
  return pipe::loss_of(
      [](const at::Tensor& out, const at::Tensor& target) { return at::mse_loss(out, target); });
}

struct Groups {
  GroupPtr world, self, ep;
  std::string schedule;  // the expert-parallel pipeline's pipeline.schedule ("": its default)
};

void run_case(const Groups& g, const Case& c, int steps) {
  const int rank = g.world->rank();
  const std::string where = "case " + c.name + ": ";
  const auto topo = pipe::pipe_model_data_topology(kStages, 1, kData);

  // The reference: one rank, one stage, the whole global batch (dropless); or ep 1 on the same
  // 2 x 2 layout (dropping).
  pipe::PipelineOptions ref_options = pipe::PipelineOptions(c.dropless ? 1 : kStages)
                                          .partition_method("uniform")
                                          .seed_layers(true)
                                          .loss_fn(mse());
  if (c.dropless)
    ref_options.group(g.self);
  else
    ref_options.group(g.world).topology(topo);
  auto ref = dscpp::initialize(pipe::PipelineModule(specs(c, 1, nullptr), ref_options),
                               ds_config(c.dropless ? kMicro * kData : kMicro, c));
  const auto ref_params = params_of(ref);

  auto options = pipe::PipelineOptions(kStages)
                     .partition_method("uniform")
                     .seed_layers(true)
                     .loss_fn(mse())
                     .group(g.world)
                     .topology(topo);
  pipe::PipelineModule module(specs(c, kEp, g.ep), options);
  const auto experts = moe::expert_parameters(*module.stage_module());
  check(experts.size() == (c.clones ? 4u * (kExperts / kEp) : 2u),
        where + "the stage's MoE layer has its local experts", rank);
  for (const auto& [name, p] : module.stage_module()->named_parameters().pairs())
    check(at::equal(p, counterpart(ref_params, experts, name)),
          where + "initial " + name + " is the reference's (same seeds, experts by global id)",
          rank);
  nlohmann::json cfg = ds_config(kMicro, c);
  if (!g.schedule.empty()) cfg["pipeline"] = {{"schedule", g.schedule}};
  auto eng = dscpp::initialize(std::move(module), cfg);
  dscpp::zero::ZeroOptimizer* ez = eng.core().expert_zero_optimizer();
  check(ez != nullptr, where + "the pipeline engine gave the experts their own optimizer", rank);
  if (!ez) return;
  check(eng.core().expert_data_group()->size() == kData / kEp,
        where + "the expert-data group has data / ep ranks", rank);

  const int d = eng.module().data_parallel_id();
  for (int step = 0; step < steps; ++step) {
    int m_ref = 0, m_ep = 0;
    pipe::DataIter ref_iter = [&] {
      const int m = m_ref++;
      return c.dropless ? batch(step, m, 0, kMicro * kData) : batch(step, m, d * kMicro, kMicro);
    };
    pipe::DataIter ep_iter = [&] { return batch(step, m_ep++, d * kMicro, kMicro); };
    const double want = ref.train_batch(ref_iter).item<double>();
    const double got = eng.train_batch(ep_iter).item<double>();
    check_close(got, want, where + "step " + std::to_string(step) + " loss", rank);
    const double n = eng.get_global_grad_norm(), n_ref = ref.get_global_grad_norm();
    check_close(n, n_ref, where + "step " + std::to_string(step) + " grad norm", rank);
    if (step == 0) check(n_ref > 0.05, where + "the clip is active", rank);
  }
  moe_test::check_weights(eng.module().stage_module()->named_parameters(), ref_params, experts,
                          where, rank);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  std::string schedule;
  std::vector<Case> cases;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    if (flag == "--case") cases.push_back(moe_test::parse_case(argv[i + 1], "kdzc", "pipe_moe"));
    if (flag == "--schedule") schedule = argv[i + 1];
  }
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  if (cases.empty()) {
    std::cerr << "pipe_moe: no --case given\n";
    return 2;
  }
  if (world->size() != kStages * kData) {
    std::cerr << "pipe_moe: needs " << kStages * kData << " ranks\n";
    return 2;
  }
  try {
    Groups g;
    g.world = world;
    g.schedule = schedule;
    // Every rank makes every group in the same order, whichever it uses.
    g.ep = dscpp::comm::new_expert_groups(*world, pipe::pipe_model_data_topology(kStages, 1, kData),
                                          kEp)
               .expert_parallel;
    for (int r = 0; r < world->size(); ++r)
      if (auto sub = world->new_subgroup({r})) g.self = sub;
    for (const auto& c : cases) run_case(g, c, steps);
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return moe_test::failures == 0 ? 0 : 1;
}
