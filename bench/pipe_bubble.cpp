// pipe_bubble: the pipeline's bubble, measured (docs/performance.md), and ZeRO-1 against ZeRO-2
// beside a pipeline. Run through the launcher; prints on rank 0.
//
// --mode bubble (p = the world's ranks, data 1): a stack of 2p layers whose forward sleeps
// --layer-ms and whose backward sleeps twice that (once for the input's gradient, once for the
// weight's, a product a split backward puts off to W), so that a stage's compute takes a fixed
// time whatever the machine's cores do. For each micro-batch count of --micro-batches and each
// schedule of --schedules (1f1b; interleaved, with each v of --chunks; zb-h1; zb-v, two chunks
// in a V), --steps batches;
// each stage's idle time (PipelineEngine::last_bubble_fraction, the smallest over the batches
// but the first) is given over its ideal time m(F + B), beside the formula (p - 1)/m,
// interleaved (p - 1)/(v m), ZB-H1 (p - 1)/(3m), ZB-V (p - 1)/(6m) (docs/pipeline.md). With --check
// TOL a stage off its formula by more than TOL relative makes the exit status 1.
//
// --mode zero (pipeline 2 x data world/2): a small GPT on the pipeline at ZeRO stage 1 and 2,
// --micro-batches' first value of micro-batches: the step time; the gradient bytes each rank
// sends per step (the stage's gradient buffer once per batch at stage 1, once per micro-batch
// at stage 2: counted from the reductions the engine issues, and the bytes the process wrote,
// /proc/self/io's wchar, which Gloo's socket writes go through); and the gradient memory a
// rank holds between micro-batches (stage 1: the whole 16-bit/fp32 buffer and the partition;
// stage 2: the partition, buckets only while in flight).
#include "dscpp/ops/autograd_function.h"  // first: see there (g++ 13's -Warray-bounds)

#include <torch/torch.h>

#include <fmt/format.h>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/ops/deferred_grads.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/zero/zero_optimizer.h"

namespace po = boost::program_options;
using dscpp::nn::LayerSpec;
using nlohmann::json;

namespace {

// A sleeping layer's forward time in ms: 0 for the warm-up batch.
std::atomic<double> g_layer_ms{0};

void sleep_ms(double ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// Sleeps ms in forward and 2 ms in backward: ms for the input's gradient (which passes through
// unchanged), ms for w's (zeros), a product put off to W inside a split backward.
struct Sleep : torch::autograd::Function<Sleep> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    const double ms = g_layer_ms.load();
    ctx->saved_data["ms"] = ms;
    ctx->save_for_backward({w});
    sleep_ms(ms);
    return x.clone();
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const double ms = ctx->saved_data["ms"].toDouble();
    const at::Tensor w = ctx->get_saved_variables()[0];
    sleep_ms(ms);
    auto product = [ms, w] {
      sleep_ms(ms);
      return at::zeros_like(w);
    };
    at::Tensor dw;
    if (!dscpp::ops::defer_weight_grad(w, product)) dw = product();
    return {grads[0], dw};
  }
};

std::vector<LayerSpec> sleeping_specs(int layers) {
  std::vector<LayerSpec> specs;
  for (int i = 0; i < layers; ++i)
    specs.push_back({"layers." + std::to_string(i),
                     [] { return torch::nn::Linear(8, 8).ptr(); },
                     [](torch::nn::Module& m, const at::Tensor& x) {
                       auto& linear = static_cast<torch::nn::LinearImpl&>(m);
                       return Sleep::apply(linear.forward(x), linear.weight);
                     },
                     "",
                     {}});
  return specs;
}

json sgd() {
  return {{"type", "SGD"}, {"params", {{"lr", 1e-3}}}};
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes this process has written through write()/writev() so far (sockets included).
int64_t written_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "wchar:") return value;
  return -1;
}

// Every rank's value, on every rank.
std::vector<double> gather(dscpp::comm::ProcessGroup& world, double v) {
  at::Tensor all = torch::zeros({world.size()}, torch::kDouble);
  world.all_gather(all, torch::full({1}, v, torch::kDouble)).wait();
  return {all.data_ptr<double>(), all.data_ptr<double>() + world.size()};
}

// The activations a stage holds, counted in the instructions the engine runs: the most
// micro-batch chunks between their forward and their backward (B where split), and between
// their forward and their W (the backward where whole): "B/W".
std::string held_to_backward_and_weight(const dscpp::pipe::PipeShape& shape) {
  using dscpp::pipe::Op;
  int forwards = 0, backwards = 0, weights = 0, to_b = 0, to_w = 0;
  for (const auto& step : dscpp::pipe::train_schedule(shape))
    for (const auto& i : step) {
      forwards += i.op == Op::kForward;
      backwards += i.op == Op::kBackward || i.op == Op::kBackwardInput;
      weights += i.op == Op::kBackward || i.op == Op::kBackwardWeight;
      to_b = std::max(to_b, forwards - backwards);
      to_w = std::max(to_w, forwards - weights);
    }
  return fmt::format("{}/{}", to_b, to_w);
}

int bubble(const std::shared_ptr<dscpp::comm::ProcessGroup>& world,
           const std::vector<int>& micro_batches, const std::vector<std::string>& schedules,
           const std::vector<int>& chunks, double ms, int steps, double check) {
  const int p = world->size();
  bool ok = true;
  if (world->rank() == 0)
    std::cout << fmt::format(
        "pipe_bubble: {} stages, 2 x {} layers of {} ms forward, {} ms backward (sleeps)\n"
        "{:>4} {:>12} {:>6} {:>10} {:>14} {:>9} {:>30} {:>24}\n",
        p, p, ms, 2 * ms, "m", "schedule", "steps", "batch ms", "idle / ideal", "formula",
        "per stage (idle / ideal)", "held to B/W per stage");
  // (schedule, chunks) in the order asked.
  std::vector<std::pair<std::string, int>> runs;
  for (const auto& name : schedules) {
    if (name == "interleaved")
      for (int v : chunks) runs.emplace_back(name, v);
    else
      runs.emplace_back(name, name == "zb-v" ? 2 : 1);
  }
  for (const auto& [name, v] : runs) {
    const auto kind = dscpp::pipe::parse_schedule_kind(name);
    for (int m : micro_batches) {
      dscpp::pipe::PipelineOptions options(p);
      options.group(world)
          .num_chunks(v)
          .v_shape(kind == dscpp::pipe::ScheduleKind::kZeroBubbleV)
          .partition_method("uniform")
          .loss_fn(dscpp::pipe::loss_of(
              [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
      dscpp::pipe::PipelineModule module(sleeping_specs(2 * p), options);
      json cfg = {{"train_batch_size", m},
                  {"train_micro_batch_size_per_gpu", 1},
                  {"optimizer", sgd()},
                  {"pipeline", {{"schedule", name}}}};
      auto engine = dscpp::initialize(module, cfg);
      dscpp::pipe::DataIter it = [] {
        return dscpp::pipe::MicroBatch{{torch::ones({1, 8})}, torch::zeros({1, 8})};
      };
      // The first batch agrees shapes and makes buffers, without sleeps; then the
      // least-disturbed batch of the others (the machine's other load delays a stage's
      // wake-ups, which count as idle).
      double b = 1, wall = 0;
      for (int s = 0; s < steps; ++s) {
        g_layer_ms = s == 0 ? 0.0 : ms;
        const double t0 = now_s();
        (void)engine.train_batch(it);
        if (s == 0) continue;
        if (engine.last_bubble_fraction() < b) {
          b = engine.last_bubble_fraction();
          wall = now_s() - t0;
        }
      }
      const auto per_stage = gather(*world, b / (1 - b));  // idle over compute: over ideal
      const double formula = dscpp::pipe::bubble_fraction({p, 0, m, v, kind});
      double mean = 0;
      std::string stages;
      for (double x : per_stage) {
        mean += x / p;
        stages += fmt::format(" {:.3f}", x);
        if (check > 0 && std::abs(x - formula) > check * formula) ok = false;
      }
      std::string held;
      for (int s = 0; s < p; ++s) held += " " + held_to_backward_and_weight({p, s, m, v, kind});
      if (world->rank() == 0)
        std::cout << fmt::format("{:>4} {:>12} {:>6} {:>10.1f} {:>14.3f} {:>9.3f} {:>30} {:>24}\n",
                                 m, name == "interleaved" ? fmt::format("interleaved{}", v) : name,
                                 dscpp::pipe::train_schedule({p, 0, m, v, kind}).size(), 1e3 * wall,
                                 mean, formula, stages, held)
                  << std::flush;
    }
  }
  if (check > 0 && world->rank() == 0)
    std::cout << (ok ? fmt::format("bubble: every stage within {:.0f}% of its formula\n",
                                   100 * check)
                     : fmt::format("bubble: FAILED: a stage off its formula by more than {:.0f}%\n",
                                   100 * check))
              << std::flush;
  return ok ? 0 : 1;
}

dscpp::model_zoo::GPTConfig small_gpt() {
  dscpp::model_zoo::GPTConfig c;
  c.vocab_size = 1024;
  c.hidden_size = 128;
  c.num_layers = 4;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

int zero(const std::shared_ptr<dscpp::comm::ProcessGroup>& world, int m, int steps) {
  const int data = world->size() / 2;
  if (world->rank() == 0)
    std::cout << fmt::format(
        "pipe_bubble --mode zero: GPT h128 L4 seq32 vocab1024, pipeline 2 x data {}, "
        "{} micro-batches of 2, fp32, Gloo on CPU\n"
        "{:>5} {:>10} {:>22} {:>22} {:>20} {:>24}\n",
        data, m, "ZeRO", "step ms", "grad reductions/step", "grad bytes sent/rank",
        "bytes written/rank", "grad memory/rank (MiB)");
  for (int stage : {1, 2}) {
    dscpp::pipe::PipelineOptions options(2);
    options.group(world).seed_layers(true).loss_fn(
        dscpp::pipe::loss_of([](const at::Tensor& o, const at::Tensor& l) {
          return dscpp::model_zoo::gpt_loss(o, l, false);
        }));
    dscpp::pipe::PipelineModule module(dscpp::model_zoo::gpt_layer_specs(small_gpt()), options);
    json cfg = {{"train_batch_size", 2 * m * data},
                {"train_micro_batch_size_per_gpu", 2},
                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 1 << 30}}}};
    auto engine = dscpp::initialize(module, cfg);
    int64_t k = 0;
    dscpp::pipe::DataIter it = [&k] {
      auto i = torch::arange(k, k + 2, torch::kLong).unsqueeze(1);
      ++k;
      auto tokens = (i * 7 + torch::arange(32, torch::kLong) * 3) % 1024;
      return dscpp::pipe::MicroBatch{{tokens}, (tokens + 1) % 1024};
    };
    auto& zo = engine.core().zero_optimizer();
    const int64_t elem = 4;  // fp32
    // One reduce-scatter of the stage's whole (padded) gradient buffer per reduction: once a
    // batch at stage 1, once a micro-batch at stage 2 (pipe/pipeline_engine.h).
    const int reductions = stage == 1 ? 1 : m;
    const int64_t grad_bytes = reductions * zo.layout().total * elem * (data - 1) / data;
    double time_sum = 0, wrote_sum = 0;
    for (int s = 0; s < steps; ++s) {
      const double t0 = now_s();
      const int64_t w0 = written_bytes();
      (void)engine.train_batch(it);
      if (s == 0) continue;
      time_sum += now_s() - t0;
      wrote_sum += static_cast<double>(written_bytes() - w0);
    }
    const at::Tensor& flat = zo.grad_buckets().flat_grads();
    const double held =
        // (on one data rank the flat buffer may be the partition itself: counted once)
        static_cast<double>(
            (flat.defined() && !zo.grads_aliased() ? flat.numel() * flat.element_size() : 0) +
            zo.grad_partition().numel() * zo.grad_partition().element_size());
    const auto times = gather(*world, time_sum / (steps - 1));
    const auto wrote = gather(*world, wrote_sum / (steps - 1));
    const auto mem = gather(*world, held);
    const auto grads = gather(*world, static_cast<double>(grad_bytes));
    if (world->rank() == 0) {
      double t = 0, w = 0, g = 0, hm = 0;
      for (int r = 0; r < world->size(); ++r) {
        t = std::max(t, times[r]);
        w += wrote[r] / world->size();
        g += grads[r] / world->size();
        hm = std::max(hm, mem[r]);
      }
      std::cout << fmt::format("{:>5} {:>10.1f} {:>22} {:>22.0f} {:>20.0f} {:>24.2f}\n", stage,
                               1e3 * t, reductions, g, w, hm / (1 << 20))
                << std::flush;
    }
  }
  return 0;
}

std::vector<std::string> strings(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<int> ints(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, mbs, chunks, schedules;
  double ms = 0, check = 0;
  int steps = 0;
  po::options_description desc("pipe_bubble");
  desc.add_options()("mode", po::value(&mode)->default_value("bubble"), "bubble or zero")(
      "micro-batches", po::value(&mbs)->default_value("4,8,16,32"), "comma-separated m")(
      "schedules", po::value(&schedules)->default_value("1f1b,interleaved,zb-h1,zb-v"),
      "comma-separated: 1f1b, interleaved, zb-h1, zb-v")(
      "chunks", po::value(&chunks)->default_value("2"), "interleaved: chunks per stage (v > 1)")(
      "layer-ms", po::value(&ms)->default_value(5.0), "a layer's forward sleep (backward: 2x)")(
      "steps", po::value(&steps)->default_value(3), "batches per case (the first not counted)")(
      "check", po::value(&check)->default_value(0.0),
      "fail when a stage is off its formula by more than this, relative (0: report only)")(
      "local_rank", po::value<int>(), "set by the launcher");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
    if (steps < 2) throw std::invalid_argument("--steps: at least 2 (the first is not counted)");
    auto world = dscpp::comm::init_distributed();
    if (mode == "bubble")
      return bubble(world, ints(mbs), strings(schedules), ints(chunks), ms, steps, check);
    if (mode == "zero") {
      if (world->size() < 4 || world->size() % 2 != 0)
        throw std::invalid_argument("--mode zero: pipeline 2 x data >= 2 needs an even world >= 4");
      return zero(world, ints(mbs).at(0), steps);
    }
    throw std::invalid_argument("--mode: expected bubble or zero, found " + mode);
  } catch (const std::exception& e) {
    std::cerr << "pipe_bubble: " << e.what() << "\n";
    return 1;
  }
}
