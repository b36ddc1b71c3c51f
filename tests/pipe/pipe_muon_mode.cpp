// pipe_train --mode muon: see pipe_train_modes.h.
#include <torch/torch.h>

#include <fmt/format.h>

#include <atomic>
#include <iostream>

#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/engine/engine.h"
#include "tests/pipe/pipe_train_modes.h"

namespace pipe_test {

// Muon on a pipeline: each stage's engine steps its stage's matrices whole (the Muon partition
// of its ZeRO set) and its biases with the auxiliary Adam, the norm over every stage. Against
// the non-pipeline engine over the whole MLP on the stage's data group, each data rank the same
// micro-batches accumulated: losses and weights within 1e-5 after `steps` steps (no clipping:
// the norm's summation order differs between the layouts, and Newton-Schulz in half precision
// would turn a clip coefficient's last bit into a rounding flip; they come out equal).
int muon_cases(const GroupPtr& world, const json& cases, int steps,
               const std::string& checkpoint_dir) {
  GroupPtr self;
  for (int r = 0; r < world->size(); ++r)
    if (auto g = world->new_subgroup({r})) self = g;
  const json muon = {{"type", "Muon"},
                     {"params", {{"lr", 0.02}, {"momentum", 0.95}, {"weight_decay", 0.01}}}};
  bool ok = true;
  for (const auto& c : cases) {
    const int p = c["stages"], m = c["micro_batches"], z = c["zero"];
    const std::string schedule = c.value("schedule", "auto");
    const int d = world->size() / p;
    const int64_t mb = kGlobalBatch / (m * d);
    const json optimizer = c.value("optimizer", muon);
    dscpp::pipe::PipelineOptions options(p);
    options.group(world)
        .num_chunks(c.value("chunks", 1))
        .v_shape(schedule == "zb-v")
        .partition_method("uniform")
        .seed_layers(true)
        .base_seed(kBaseSeed)
        .loss_fn(dscpp::pipe::loss_of(
            [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
    dscpp::pipe::PipelineModule module(mlp_specs(), options);
    // The reference: the whole MLP without a pipeline on this stage's data group (its ranks
    // reduce as the pipeline's do), each data rank the same micro-batches in the same order.
    dscpp::pipe::PipelineOptions ref_options(1);
    ref_options.group(self).seed_layers(true).base_seed(kBaseSeed);
    dscpp::pipe::PipelineModule ref_module(mlp_specs(), ref_options);
    auto ref_stage = ref_module.stage_module();
    dscpp::InitArgs data_ranks;
    data_ranks.group = module.data_group();
    auto ref = dscpp::initialize(ref_stage,
                                 json{{"train_batch_size", kGlobalBatch},
                                      {"train_micro_batch_size_per_gpu", mb},
                                      {"optimizer", optimizer},
                                      {"zero_optimization", {{"stage", z}}}},
                                 data_ranks);
    auto engine = dscpp::initialize(module, json{{"train_batch_size", kGlobalBatch},
                                                 {"train_micro_batch_size_per_gpu", mb},
                                                 {"optimizer", optimizer},
                                                 {"zero_optimization", {{"stage", z}}},
                                                 {"pipeline", {{"schedule", schedule}}}});
    const int rank = engine.module().data_parallel_id();
    double worst_loss = 0;
    for (int s = 0; s < steps; ++s) {
      at::Tensor ref_loss = torch::zeros({1}, torch::kDouble);
      for (int j = 0; j < m; ++j) {
        auto [x, y] = samples("mlp", s * kGlobalBatch + (j * d + rank) * mb, mb);
        at::Tensor loss = torch::mse_loss(ref_module.forward_chunk(0, {x})[0], y);
        ref.backward(loss);
        ref.step();
        ref_loss += loss.item<double>() / m;
      }
      module.data_group()->all_reduce(ref_loss, dscpp::comm::ReduceOp::kAvg).wait();
      int64_t j = 0;
      dscpp::pipe::DataIter it = [&]() {
        auto [x, y] = samples("mlp", s * kGlobalBatch + (j++ * d + rank) * mb, mb);
        return dscpp::pipe::MicroBatch{{x}, y};
      };
      const double got = engine.train_batch(it).item<double>();
      const double want = ref_loss.item<double>();
      worst_loss = std::max(worst_loss, std::abs(got - want) / std::abs(want));
    }
    double worst_weight = 0;
    auto ref_params = ref_stage->named_parameters(true);
    for (const auto& item : engine.module().stage_module()->named_parameters(true)) {
      const at::Tensor want = ref_params[item.key()].detach().to(torch::kDouble);
      const at::Tensor got = item.value().detach().to(torch::kDouble);
      worst_weight =
          std::max(worst_weight,
                   ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>());
    }
    // The Muon partition holds this stage's matrices; the Adam half the rest.
    const bool has_muon =
        engine.core().zero_partitions().size() == (optimizer["type"] == "Muon" ? 2u : 1u);
    at::Tensor mine =
        torch::tensor({worst_loss, worst_weight, has_muon ? 0.0 : 1.0}, torch::kDouble);
    world->all_reduce(mine, dscpp::comm::ReduceOp::kMax).wait();
    const bool pass = mine[0].item<double>() <= 1e-5 && mine[1].item<double>() <= 1e-5 &&
                      mine[2].item<double>() == 0.0;
    ok &= pass;
    if (world->rank() == 0)
      std::cout << fmt::format("muon: {} {}: losses {:.1e}, weights {:.1e} from no pipeline{}\n",
                               pass ? "PASS" : "FAIL", c["name"].get<std::string>(),
                               mine[0].item<double>(), mine[1].item<double>(),
                               mine[2].item<double>() == 0.0 ? "" : " (the partitions are wrong)")
                << std::flush;
  }
  // A pipeline's checkpoint of a Muon run (its stages' Muon and Adam groups): a fresh engine that
  // loads it after step 2 trains step 3 as the saving one does, bit for bit.
  if (!checkpoint_dir.empty()) {
    auto make = [&] {
      dscpp::pipe::PipelineOptions options(2);
      options.group(world)
          .partition_method("uniform")
          .seed_layers(true)
          .base_seed(kBaseSeed)
          .loss_fn(dscpp::pipe::loss_of(
              [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
      return dscpp::initialize(dscpp::pipe::PipelineModule(mlp_specs(), options),
                               json{{"train_batch_size", kGlobalBatch},
                                    {"gradient_accumulation_steps", 2},
                                    {"optimizer", muon},
                                    {"zero_optimization", {{"stage", 1}}}});
    };
    const int d = world->size() / 2;
    auto batch = [&](dscpp::pipe::PipelineEngine& e, int s) {
      int64_t j = 0;
      const int64_t mb = kGlobalBatch / (2 * d);
      const int rank = e.module().data_parallel_id();
      return e
          .train_batch([&]() {
            auto [x, y] = samples("mlp", s * kGlobalBatch + (j++ * d + rank) * mb, mb);
            return dscpp::pipe::MicroBatch{{x}, y};
          })
          .item<double>();
    };
    auto first = make();
    for (int s = 0; s < 2; ++s) (void)batch(first, s);
    first.save_checkpoint(checkpoint_dir);
    const double want = batch(first, 2);
    auto second = make();
    (void)second.load_checkpoint(checkpoint_dir);
    const double got = batch(second, 2);
    bool same = got == want;
    auto a = first.module().stage_module()->named_parameters(true);
    for (const auto& item : second.module().stage_module()->named_parameters(true))
      same &= at::equal(item.value(), a[item.key()]);
    at::Tensor flag = torch::full({1}, same ? 0.0 : 1.0, torch::kDouble);
    world->all_reduce(flag, dscpp::comm::ReduceOp::kMax).wait();
    same = flag.item<double>() == 0.0;
    ok &= same;
    if (world->rank() == 0)
      std::cout << "muon: " << (same ? "PASS" : "FAIL")
                << " a pipeline's Muon checkpoint resumes bit for bit (loss " << got << " against "
                << want << ")\n";
  }
  // A weight tied across stages stepped by Muon would miss the tied sum: refused, naming it.
  {
    dscpp::pipe::PipelineOptions options(world->size());
    options.group(world).seed_layers(true).loss_fn(dscpp::pipe::loss_of(
        [](const at::Tensor& o, const at::Tensor& l) { return loss_of("gpt", o, l); }));
    dscpp::pipe::PipelineModule module(specs_of("gpt"), options);
    dscpp::InitArgs args;
    args.use_muon = {{"embedding.word.weight", true}};
    std::string what;
    try {
      (void)dscpp::initialize(module,
                              json{{"train_batch_size", kGlobalBatch},
                                   {"gradient_accumulation_steps", 2},
                                   {"optimizer", muon}},
                              args);
    } catch (const std::exception& e) {
      what = e.what();
    }
    const bool named = what.find("tied weight 'embedding.word.weight'") != std::string::npos &&
                       what.find("muon partition") != std::string::npos;
    ok &= named;
    if (world->rank() == 0)
      std::cout << "muon: " << (named ? "PASS" : "FAIL")
                << " a weight tied across stages under Muon is refused: " << what << "\n";
  }
  if (world->rank() == 0)
    std::cout << (ok ? "muon: every case as without a pipeline\n" : "muon: FAILED\n") << std::flush;
  return ok ? 0 : 1;
}

}  // namespace pipe_test
