// pipe_train --mode schedules: see pipe_train_modes.h.
#include <torch/torch.h>

#include <fmt/format.h>

#include <atomic>
#include <iostream>

#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/engine/engine.h"
#include "tests/pipe/pipe_train_modes.h"

namespace pipe_test {
namespace {

// ZB-H1 against 1F1B on the same pipeline (the tiny GPT, whose linears put their weight
// products off to W), bit for bit: fp32 with gradient clipping that clips every step, and fp16
// with a step whose gradient overflows (a spike layer after the embedding adding nothing, its
// weight's gradient g_spike times the stream's dot product with its gradient; g_spike is 0 on
// the other steps). Losses, global
// norms, skipped steps, loss scales and this stage's weights must be equal.
std::atomic<double> g_spike{0};

json train_with_schedule(const GroupPtr& world, const std::string& schedule, bool fp16) {
  auto specs = specs_of("gpt");
  if (fp16)
    specs.insert(specs.begin() + 1, LayerSpec{"spike",
                                              [] {
                                                auto m = std::make_shared<torch::nn::Module>();
                                                m->register_parameter("w", torch::zeros({1}));
                                                return m;
                                              },
                                              [](torch::nn::Module& m, const at::Tensor& x) {
                                                at::Tensor w = m.named_parameters()["w"];
                                                return x + (w - w.detach()) * g_spike.load() * x;
                                              },
                                              "",
                                              {}});
  dscpp::pipe::PipelineOptions options(world->size());
  options.group(world).seed_layers(true).base_seed(kBaseSeed).loss_fn(
      dscpp::pipe::loss_of([](const at::Tensor& o, const at::Tensor& l) {
        return loss_of("gpt", o.to(at::kFloat), l);
      }));
  dscpp::pipe::PipelineModule module(specs, options);
  json cfg = {{"train_batch_size", kGlobalBatch},
              {"gradient_accumulation_steps", 8},
              {"gradient_clipping", 0.05},
              {"optimizer", optimizer_config("gpt")},
              {"pipeline", {{"schedule", schedule}}}};
  if (fp16) cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  auto engine = dscpp::initialize(module, cfg);
  json r;
  for (int s = 0; s < 4; ++s) {
    g_spike = fp16 && s == 1 ? 1e5 : 0.0;
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples("gpt", s * kGlobalBatch + j++ * 2, 2);
      return dscpp::pipe::MicroBatch{{x}, y};
    };
    r["losses"].push_back(engine.train_batch(it).item<double>());
    r["norms"].push_back(engine.get_global_grad_norm());
  }
  r["skipped"] = engine.core().skipped_steps();
  r["scale"] = engine.loss_scale();
  for (const auto& item : engine.module().stage_module()->named_parameters())
    r["params"][item.key()] = flat(item.value());
  return r;
}

}  // namespace

int schedules_agree(const GroupPtr& world) {
  bool ok = true;
  std::string report;
  for (bool fp16 : {false, true}) {
    const json a = train_with_schedule(world, "1f1b", fp16);
    const json b = train_with_schedule(world, "zb-h1", fp16);
    bool same = a == b;
    // The cases must be what they claim: every fp32 step clipped; one fp16 step skipped.
    for (const auto& n : a["norms"]) same &= fp16 || n.get<double>() > 0.05;
    if (fp16) same &= a["skipped"].get<int64_t>() == 1;
    ok &= same;
    report += fmt::format(" {}: {} (norms {}, skipped {}, scale {});", fp16 ? "fp16" : "fp32",
                          same ? "equal" : "DIFFERENT", a["norms"].dump(), a["skipped"].dump(),
                          a["scale"].dump());
  }
  at::Tensor all = torch::full({1}, ok ? 1.0 : 0.0, torch::kDouble);
  world->all_reduce(all, dscpp::comm::ReduceOp::kMin).wait();
  ok = all.item<double>() == 1.0;
  if (world->rank() == 0)
    std::cout << (ok ? "schedules: zb-h1 equals 1f1b bit for bit:" : "schedules: FAILED:") << report
              << "\n"
              << std::flush;
  return ok ? 0 : 1;
}

}  // namespace pipe_test
