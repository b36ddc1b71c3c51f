// optim_trajectory: runs an optimizer (and LR schedule) over deterministic data and prints
// what happened as JSON, for test_against_pytorch.py to replay in PyTorch and DeepSpeed.
//
// Spec (argv[1] as JSON text, else stdin; a list of specs gives a list of results):
//   {"optimizer": {"type", "params"}, "scheduler": {"type", "params"} (optional),
//    "steps": N, "size": n, "seed": s, "shards": [{"size": n, "hyper": {...}}] (optional)}
// Data: fp32 roundings of double formulas that Python evaluates identically (math.sin/cos):
//   param[k][i]   = (0.5 + 0.4 * sin(1.3*i + 0.7*k + seed)) * (i odd ? -1 : 1)
//   grad[t][k][i] = 0.1 * cos(0.37*i + 1.1*t + 0.5*k + seed) + 0.02 * sin(0.05*i*(t + 1))
// Steps follow DeepSpeed's engine: optimizer step, then scheduler step.
// Result: "lr"/"momentum"/"scheduler_lr" per number of steps taken (0: before the first),
// each a list over shards (scheduler_lr: get_lr()), "params" (final shards), "state_numel";
// or {"error", "path"} when the config is rejected.
#include <ATen/ops/empty.h>

#include <cmath>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/optim/optimizer.h"

namespace {

using nlohmann::json;

template <typename F>
at::Tensor fill(int64_t n, F formula) {
  at::Tensor t = at::empty({n}, at::kFloat);
  float* data = t.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(formula(i));
  return t;
}

json run(const json& spec) {
  try {
    dscpp::OptimizerConfig oc;
    oc.type = spec.at("optimizer").at("type").get<std::string>();
    oc.params = spec["optimizer"].value("params", json::object());
    auto opt = dscpp::optim::make_optimizer(oc);
    const double seed = spec.value("seed", 0.0);
    json shards = spec.value("shards", json::array({{{"size", spec.value("size", 16)}}}));
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < shards.size(); ++k) {
      const int64_t n = shards[k].at("size").get<int64_t>();
      const double kk = static_cast<double>(k);
      sizes.push_back(n);
      opt->add_shard(fill(n,
                          [&](int64_t i) {
                            return (0.5 + 0.4 * std::sin(1.3 * i + 0.7 * kk + seed)) *
                                   (i % 2 ? -1 : 1);
                          }),
                     shards[k].value("hyper", json::object()));
    }
    std::unique_ptr<dscpp::optim::LRScheduler> sched;
    if (spec.contains("scheduler")) {
      dscpp::SchedulerConfig sc;
      sc.type = spec["scheduler"].at("type").get<std::string>();
      sc.params = spec["scheduler"].value("params", json::object());
      sched = dscpp::optim::make_scheduler(sc, *opt);
    }

    json out = {{"lr", json::array()}, {"momentum", json::array()}};
    auto record = [&] {
      json lrs = json::array(), moms = json::array();
      for (int k = 0; k < opt->num_shards(); ++k) {
        lrs.push_back(opt->get_lr(k));
        moms.push_back(opt->get_momentum(k));
      }
      out["lr"].push_back(lrs);
      out["momentum"].push_back(moms);
      if (sched) out["scheduler_lr"].push_back(sched->get_lr());
    };
    record();
    const int64_t steps = spec.value("steps", 10);
    for (int64_t t = 0; t < steps; ++t) {
      std::vector<at::Tensor> grads;
      for (size_t k = 0; k < sizes.size(); ++k) {
        const double tt = static_cast<double>(t), kk = static_cast<double>(k);
        grads.push_back(fill(sizes[k], [&](int64_t i) {
          return 0.1 * std::cos(0.37 * i + 1.1 * tt + 0.5 * kk + seed) +
                 0.02 * std::sin(0.05 * i * (tt + 1));
        }));
      }
      opt->step(grads);
      if (sched) sched->step();
      record();
    }
    out["params"] = json::array();
    for (int k = 0; k < opt->num_shards(); ++k) {
      const at::Tensor& p = opt->shard(k);
      const float* d = p.data_ptr<float>();
      out["params"].push_back(std::vector<double>(d, d + p.numel()));
    }
    out["state_numel"] = opt->state_numel();
    out["name"] = opt->name();
    return out;
  } catch (const dscpp::ConfigError& e) {
    return {{"error", e.what()}, {"path", e.path()}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string text = argc > 1 ? argv[1]
                                : std::string(std::istreambuf_iterator<char>(std::cin),
                                              std::istreambuf_iterator<char>());
    json spec = json::parse(text);
    json result;
    if (spec.is_array()) {
      result = json::array();
      for (const json& s : spec) result.push_back(run(s));
    } else {
      result = run(spec);
    }
    std::cout << result.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "optim_trajectory: " << e.what() << "\n";
    return 2;
  }
}
