// Tensor parallelism in the engine (InitArgs::model_group), run by the launcher on t x d
// ranks: TensorParallelGPT at t, ZeRO over the d data ranks, trains like model_zoo's GPT on
// one rank with the same global batch (each rank also runs that one-rank engine, on a group of
// itself): every micro-step's loss (averaged over the data ranks), every step's global
// gradient norm (gradient_clipping is active, so a replica counted t times would also change
// the weights), and after the steps each parameter against its slice of the one-rank weight,
// within 1e-5 relative. Also: each rank holds 1/t of the split parameters (the layers' linears
// and the vocabulary).
//   tp_engine --tensor T --case z<stage>g<ga>s<sp>o<overlap> [--case ...] [--steps N]
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>

#include <iostream>
#include <string>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "tests/runtime/engine/tp_common.h"

using nlohmann::json;
using tp_test::check;
using tp_test::check_close;
namespace mz = dscpp::model_zoo;

namespace {

struct Case {
  int stage = 0, ga = 1;
  bool sp = false, overlap = false;
  std::string name;
};

Case parse_case(const std::string& s) {
  Case c;
  c.name = s;
  if (std::sscanf(s.c_str(), "z%dg%d", &c.stage, &c.ga) != 2) throw dscpp::Error("bad case " + s);
  c.sp = s.find("s1") != std::string::npos;
  c.overlap = s.find("o1") != std::string::npos;
  return c;
}

json ds_config(int micro, const Case& c, int stage) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", c.ga},
          // SGD with momentum, not Adam: Adam turns the rounding noise of a gradient that is
          // zero in exact arithmetic (the key bias's: softmax ignores it) into steps of lr.
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}}},
          // Small enough to clip every step: the norm's value reaches the weights.
          {"gradient_clipping", 0.5},
          {"zero_optimization",
           {{"stage", stage}, {"overlap_comm", c.overlap}, {"reduce_bucket_size", 20000}}},
          {"steps_per_print", 0}};
}

void run_case(dscpp::comm::ProcessGroup& world, int t, const Case& c, int steps) {
  const int rank = world.rank();
  const auto g = tp_test::make_groups(world, t);
  const int micro = 2;
  const std::string where =
      "case " + c.name + " t" + std::to_string(t) + "d" + std::to_string(g.d) + ": ";

  at::manual_seed(1);
  mz::GPT ref_model(tp_test::tiny(1, false));
  dscpp::InitArgs ref_args;
  ref_args.group = g.self;
  auto ref = dscpp::initialize(ref_model, ds_config(micro * g.d, c, 0), std::move(ref_args));

  at::manual_seed(1);
  mz::TensorParallelGPT tp_model(tp_test::tiny(t, c.sp), g.model);
  // Memory: each rank holds 1/t of every split parameter, the replicas whole (read before the
  // engine starts: stage 3 then keeps only a 1/d partition of each).
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*tp_model);
  const auto ref_params = ref_model->named_parameters();
  int64_t split_here = 0, split_whole = 0, replicated = 0, ref_total = 0;
  for (const auto& p : tp_model->named_parameters()) {
    const auto& a = attrs.at(p.key());
    if (a.tensor_model_parallel) {
      split_here += p.value().numel();
      split_whole += ref_params[p.key()].numel();
    } else {
      replicated += p.value().numel();
    }
  }
  for (const auto& p : ref_params) ref_total += p.value().numel();
  check(split_here * t == split_whole && split_whole + replicated == ref_total,
        where + "each rank holds 1/t of the split parameters", rank);

  dscpp::InitArgs args;
  args.group = g.data;
  args.model_group = g.model;
  auto eng = dscpp::initialize(tp_model, ds_config(micro, c, c.stage), std::move(args));

  for (int step = 0; step < steps; ++step) {
    const at::Tensor tokens = tp_test::batch(step, int64_t{micro} * g.d * c.ga);
    for (int m = 0; m < c.ga; ++m) {
      const at::Tensor all = tokens.narrow(0, int64_t{m} * micro * g.d, micro * g.d);
      at::Tensor ref_loss =
          ref_model->loss(ref.forward(all.narrow(1, 0, 16)), all.narrow(1, 1, 16));
      ref.backward(ref_loss);
      ref.step();
      const at::Tensor mine = all.narrow(0, int64_t{g.dp_rank} * micro, micro);
      at::Tensor loss = tp_model->loss(eng.forward(mine.narrow(1, 0, 16)), mine.narrow(1, 1, 16));
      eng.backward(loss);
      eng.step();
      at::Tensor mean = loss.detach().clone();
      g.data->all_reduce(mean).wait();
      const double got = mean.item<double>() / g.d, want = ref_loss.item<double>();
      check_close(got, want, where + "step " + std::to_string(step) + " loss", rank);
    }
    const double n = eng.get_global_grad_norm(), n_ref = ref.get_global_grad_norm();
    check_close(n, n_ref, where + "step " + std::to_string(step) + " grad norm", rank);
    if (step == 0) check(n_ref > 0.5, where + "the clip is active (norm > 0.5)", rank);
  }
  double worst = 0;
  std::string worst_name;
  std::vector<at::Tensor> params;  // stage 3: the whole values gathered for the comparison
  for (const auto& p : tp_model->named_parameters()) params.push_back(p.value());
  auto gathered = eng.gathered_parameters(params);
  for (const auto& p : tp_model->named_parameters()) {
    const auto& a = attrs.at(p.key());
    const at::Tensor& whole = ref_params[p.key()];
    const at::Tensor want =
        a.tensor_model_parallel
            ? dscpp::nn::partition_of(whole, a.partition_dim, a.partition_stride, g.tp_rank, t)
            : whole;
    const double e = tp_test::rel_err(p.value(), want);
    if (e > worst) worst = e, worst_name = p.key();
  }
  check(worst <= 1e-5, where + "weights: worst " + worst_name + " " + std::to_string(worst), rank);
  if (rank == 0)
    std::cout << where << "done, worst weight error " << worst << " (" << worst_name << ")\n";
}

}  // namespace

int main(int argc, char** argv) {
  int t = 2, steps = 20;
  std::vector<Case> cases;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i], value = argv[i + 1];  // (--local_rank=N skipped)
    if (flag == "--tensor")
      t = std::stoi(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--case")
      cases.push_back(parse_case(value));
  }
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  if (cases.empty()) {
    std::cerr << "tp_engine: no --case given\n";
    return 2;
  }
  try {
    for (const Case& c : cases) run_case(*world, t, c, steps);
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return tp_test::failures == 0 ? 0 : 1;
}
