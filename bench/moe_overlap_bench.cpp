// The MoE layer at expert parallelism over Gloo (CPU): forward + backward with the shared expert
// in the serial order (after the routed path) against beside the all-to-alls
// (MoEOptions::shared_expert_overlap, nn/moe/moe.h), with token dropping (the fixed-size
// exchange of the padded [E, C, H] layout) and dropless (the variable-size one). Gloo runs the
// exchange in its own threads, so the overlap is real on CPU. Each iteration starts after a
// barrier and ends when this rank's backward returns; the row is the median over --iters of
// the slowest rank's time, the three variants taking turns within each iteration. Also the shared
// expert alone (what the overlap can hide at most) and the layer without it.
//   dscpp --num_gpus 2 --master_port 0 build/bench/moe_overlap_bench [--tokens 4096]
//     [--hidden 256] [--experts 8] [--k 2] [--ffn 256] [--shared-ffn 2048] [--iters 10]
//     [--warmup 2] [--backend gloo|nccl]
// --backend nccl: the same on CUDA (device = the local rank, fp32), the exchanges on NCCL's
// stream beside the shared expert on the compute stream; each timed iteration ends with a
// read of the input's gradient, which waits for the device.
// Predicted before the first run (2 ranks on 2 shared cores, one OpenMP thread each, loopback
// TCP at ~1-2 GB/s): the exchanges of 4096 x 2 rows of 1 KiB ~4 ms each way, 4 per step
// (~16 ms); the shared expert (4096 x 256 x 2048, three products each way) ~20 ms; the
// overlap saving ~10 ms of ~60 ms where Gloo's thread finds a core free.
// Measured (2026-12-04, 2 cores shared with other builds): the shared expert at FFN 2048
// took 386 ms, not 20 (one thread, ~35 GFLOP/s); at --shared-ffn 512 it took 47 ms, the four
// exchanges alone 14 ms, the layer 138 ms serial / 142 ms overlapped with a capacity and
// 135 / 132 ms dropless: no difference beyond the noise (+-10 ms between runs), Gloo's threads
// finding no free core.
// Predicted for the GPU row (bench/rows.toml's moe-overlap-x2 on 2 H200s: --tokens 16384
// --hidden 2048 --ffn 1024 --shared-ffn 2048, fp32): each exchange sends ~128 MiB to the peer
// over NVLink, ~0.5-1 ms, ~3 ms for the four; the shared expert 12 * S * H * F ~ 0.8 TFLOP,
// ~15-20 ms in fp32; the overlap hides at most the exchanges (~2-3 ms of ~40 ms), less where
// NCCL's kernels take SMs from the GEMMs, and the dropless row also waits on its counts.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/launch_env.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"

namespace {

namespace moe = dscpp::nn::moe;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

struct Options {
  std::string backend = "gloo";
  std::map<std::string, int64_t> v = {{"--tokens", 4096}, {"--hidden", 256}, {"--experts", 8},
                                      {"--k", 2},         {"--ffn", 256},    {"--shared-ffn", 2048},
                                      {"--iters", 10},    {"--warmup", 2}};
  int64_t operator[](const std::string& f) const { return v.at(f); }
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    if (std::string(argv[i]).rfind("--local_rank", 0) == 0) {  // the launcher's
      --i;
      continue;
    }
    if (std::string(argv[i]) == "--backend" && i + 1 < argc) {
      o.backend = argv[i + 1];
      if (o.backend != "gloo" && o.backend != "nccl")
        throw std::invalid_argument("--backend must be gloo or nccl, got '" + o.backend + "'");
      continue;
    }
    auto it = o.v.find(argv[i]);
    char* end = nullptr;
    const long long x = i + 1 < argc ? std::strtoll(argv[i + 1], &end, 10) : -1;
    if (it == o.v.end() || i + 1 >= argc || *end != '\0' || x < 1)
      throw std::invalid_argument(fmt::format("unknown flag or bad value at '{}'", argv[i]));
    it->second = x;
  }
  return o;
}

// The median over iters of the slowest rank's milliseconds for each of fns, run in turn within
// each iteration (so that a neighbour's load on the shared cores falls on all of them alike).
// opts: the backend's device (NCCL reduces CUDA tensors only).
std::vector<double> medians_ms(const std::vector<std::function<void()>>& fns, const Options& o,
                               dscpp::comm::ProcessGroup& w, const at::TensorOptions& opts) {
  for (int64_t i = 0; i < o["--warmup"]; ++i)
    for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> ms(fns.size());
  for (int64_t i = 0; i < o["--iters"]; ++i) {
    for (size_t f = 0; f < fns.size(); ++f) {
      w.barrier().wait();
      const auto start = std::chrono::steady_clock::now();
      fns[f]();
      const std::chrono::duration<double, std::milli> took =
          std::chrono::steady_clock::now() - start;
      at::Tensor t = at::full({1}, took.count(), opts.dtype(at::kDouble));
      w.all_reduce(t, dscpp::comm::ReduceOp::kMax).wait();
      ms[f].push_back(t.item<double>());
    }
  }
  std::vector<double> out;
  for (auto& m : ms) {
    std::sort(m.begin(), m.end());
    out.push_back(m[m.size() / 2]);
  }
  return out;
}

moe::MoEOptions layer_options(const Options& o, const GroupPtr& ep_group, bool dropless,
                              bool shared, bool overlap) {
  const int64_t h = o["--hidden"];
  auto m = moe::MoEOptions(h)
               .num_experts(o["--experts"])
               .ep_size(ep_group->size())
               .ep_group(ep_group)
               .k(o["--k"])
               .capacity_factor(dropless ? 0.0 : 1.0)
               .use_rts(false)
               .top2_2nd_expert_sampling(false)
               .ffn_hidden_size(o["--ffn"])
               .shared_expert_overlap(overlap);
  if (shared)
    m.shared_expert(torch::nn::AnyModule(
        moe::ExpertMLP(moe::ExpertMLPOptions(h, o["--shared-ffn"]).bias(false))));
  return m;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  dscpp::comm::InitOptions init;
  init.backend = o.backend;
  GroupPtr world = dscpp::comm::init_distributed(init);
  const at::Device device = o.backend == "nccl"
                                ? at::Device(at::kCUDA, dscpp::comm::read_dist_env().local_rank)
                                : at::Device(at::kCPU);
  const auto opts = at::TensorOptions().device(device);
  const int n = world->size();
  dscpp::comm::Topology topo({"data", "model"}, {n, 1});
  const auto groups = dscpp::comm::new_expert_groups(*world, topo, n);
  const int64_t h = o["--hidden"];
  at::Tensor x = at::randn({o["--tokens"], h}, opts).requires_grad_(true);
  at::Tensor g = at::randn({o["--tokens"], h}, opts);
  // Ends when the device has: x's gradient is backward's last write.
  const auto finished = [&] { (void)x.grad().flatten()[0].item<float>(); };
  const auto step = [&](moe::MoE& layer) {
    return [&] {
      for (auto& p : layer->parameters()) p.mutable_grad() = at::Tensor();
      x.mutable_grad() = at::Tensor();
      auto y = layer->forward(x);
      (y.output * g).sum().backward();
      finished();
    };
  };
  if (world->rank() == 0)
    fmt::print(
        "moe_overlap_bench: {} ranks ({}), ep {}, {} tokens a rank, hidden {}, {} experts, "
        "top-{}, expert FFN {}, shared expert FFN {}, {} OpenMP threads a rank; forward + "
        "backward, median of {} (the slowest rank's)\n",
        n, o.backend, n, o["--tokens"], h, o["--experts"], o["--k"], o["--ffn"], o["--shared-ffn"],
        at::get_num_threads(), o["--iters"]);
  moe::ExpertMLP shared(moe::ExpertMLPOptions(h, o["--shared-ffn"]).bias(false));
  shared->to(device);
  // The layer's four exchanges at capacity 1.0 (k * S rows each, the padded [E, C, H]),
  // blocking: what the overlap can hide at most, beside the shared expert's own time.
  at::Tensor wire = at::randn({o["--k"] * o["--tokens"], h}, opts), landed = at::empty_like(wire);
  const std::vector<double> alone =
      medians_ms({[&] {
                    for (auto& p : shared->parameters()) p.mutable_grad() = at::Tensor();
                    x.mutable_grad() = at::Tensor();
                    (shared->forward(x) * g).sum().backward();
                    finished();
                  },
                  [&] {
                    for (int i = 0; i < 4; ++i)
                      groups.expert_parallel->all_to_all(landed, wire).wait();
                    (void)landed.flatten()[0].item<float>();
                  }},
                 o, *world, opts);
  if (world->rank() == 0) {
    fmt::print("  the shared expert alone      {:8.2f} ms\n", alone[0]);
    fmt::print("  the four exchanges alone     {:8.2f} ms\n", alone[1]);
  }
  for (bool dropless : {false, true}) {
    moe::MoE bare(layer_options(o, groups.expert_parallel, dropless, false, false));
    moe::MoE serial(layer_options(o, groups.expert_parallel, dropless, true, false));
    moe::MoE overlapped(layer_options(o, groups.expert_parallel, dropless, true, true));
    for (moe::MoE* m : {&bare, &serial, &overlapped}) (*m)->to(device);
    const std::vector<double> t =
        medians_ms({step(bare), step(serial), step(overlapped)}, o, *world, opts);
    if (world->rank() == 0) {
      const char* what =
          dropless ? "dropless (variable exchange)" : "capacity 1.0 (fixed [E, C, H])";
      fmt::print("  {}\n", what);
      fmt::print("    without the shared expert  {:8.2f} ms\n", t[0]);
      fmt::print("    serial                     {:8.2f} ms\n", t[1]);
      fmt::print(
          "    overlapped                 {:8.2f} ms  ({:+.1f}%, {:.2f} ms of the {:.2f} "
          "the shared expert adds hidden)\n",
          t[2], 100.0 * (t[2] - t[1]) / t[1], t[1] - t[2], t[1] - t[0]);
    }
  }
  world->barrier().wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "moe_overlap_bench: {}\n", e.what());
    return 1;
  }
}
