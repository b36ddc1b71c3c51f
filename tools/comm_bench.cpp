// comm_bench: nccl-tests for dscpp's ProcessGroup. Run under the launcher
// (`dscpp --num_gpus 2 build/tools/comm_bench --backend nccl`). For each collective and
// each size it checks one result against hand-computed values, then times --iters runs
// and prints time, algorithm bandwidth and bus bandwidth (nccl-tests' definitions: size is
// the larger buffer; busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter,
// all_gather and all_to_all, 1 for broadcast). --check: exit 1 on any wrong result.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <iostream>

#include "dscpp/comm/rendezvous.h"

namespace po = boost::program_options;
using dscpp::comm::ProcessGroup;
using dscpp::comm::ReduceOp;

namespace {

struct Bench {
  std::shared_ptr<ProcessGroup> pg;
  at::TensorOptions opts;
  int iters, warmup;
  int n, r;

  // Blocks the host until the device has finished what the current stream holds (on
  // NCCL, wait() only orders the stream): a one-element copy to the host does that.
  void sync(const at::Tensor& t) { (void)t.flatten()[0].item<float>(); }

  // Values small enough for every dtype to hold exactly: f(i) in 1..4.
  at::Tensor pattern(int64_t numel, double scale) {
    return (at::arange(numel, at::kFloat).remainder(4).add(1) * scale).to(opts);
  }
  bool same(const at::Tensor& got, const at::Tensor& want) {
    return at::equal(got.cpu(), want.cpu());
  }

  // Times fn over iters after warmup; seconds per call.
  template <typename F>
  double time(F fn, const at::Tensor& out) {
    for (int i = 0; i < warmup; ++i) fn();
    sync(out);
    pg->barrier().wait();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    sync(out);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  }

  // Returns {seconds, correct}; `bytes` is the larger buffer of the op.
  std::pair<double, bool> run(const std::string& op, int64_t bytes) {
    int64_t elem = opts.dtype().itemsize();
    int64_t numel = bytes / elem / n * n;  // divisible into n chunks
    int64_t chunk = numel / n;
    double tri = n * (n + 1) / 2.0;
    if (op == "all_reduce") {
      at::Tensor t = pattern(numel, r + 1);
      pg->all_reduce(t).wait();
      bool ok = same(t, pattern(numel, tri));
      return {time([&] { pg->all_reduce(t).wait(); }, t), ok};
    }
    if (op == "reduce_scatter") {
      at::Tensor in = pattern(numel, r + 1), out = at::empty({chunk}, opts);
      pg->reduce_scatter(out, in).wait();
      bool ok = same(out, pattern(numel, tri).slice(0, r * chunk, (r + 1) * chunk));
      return {time([&] { pg->reduce_scatter(out, in).wait(); }, out), ok};
    }
    if (op == "all_gather") {
      at::Tensor in = pattern(chunk, r + 1), out = at::empty({numel}, opts);
      pg->all_gather(out, in).wait();
      bool ok = true;
      for (int k = 0; k < n; ++k)
        ok = ok && same(out.slice(0, k * chunk, (k + 1) * chunk), pattern(chunk, k + 1));
      return {time([&] { pg->all_gather(out, in).wait(); }, out), ok};
    }
    if (op == "broadcast") {
      at::Tensor t = r == 0 ? pattern(numel, 3) : at::zeros({numel}, opts);
      pg->broadcast(t, 0).wait();
      bool ok = same(t, pattern(numel, 3));
      return {time([&] { pg->broadcast(t, 0).wait(); }, t), ok};
    }
    if (op == "all_to_all") {
      at::Tensor in = at::empty({numel}, opts), out = at::empty({numel}, opts);
      for (int j = 0; j < n; ++j) in.slice(0, j * chunk, (j + 1) * chunk).fill_((r * n + j) % 64);
      pg->all_to_all(out, in).wait();
      bool ok = true;
      for (int i = 0; i < n; ++i)
        ok = ok && same(out.slice(0, i * chunk, (i + 1) * chunk),
                        at::full({chunk}, (i * n + r) % 64, opts));
      return {time([&] { pg->all_to_all(out, in).wait(); }, out), ok};
    }
    throw std::invalid_argument("unknown op " + op);
  }

  double bus_factor(const std::string& op) const {
    if (op == "all_reduce") return 2.0 * (n - 1) / n;
    if (op == "broadcast") return 1.0;
    return static_cast<double>(n - 1) / n;
  }
};

std::string human(int64_t bytes) {
  if (bytes >= (1 << 30)) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (1 << 20)) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend, dtype, ops_arg;
  int64_t min_bytes, max_bytes;
  int iters, warmup;
  po::options_description desc("comm_bench options");
  desc.add_options()("help,h", "show this help")(
      "backend", po::value(&backend)->default_value("auto"), "gloo, nccl or auto")(
      "dtype", po::value(&dtype)->default_value("bf16"), "fp32, fp16 or bf16")(
      "ops",
      po::value(&ops_arg)->default_value(
          "all_reduce,reduce_scatter,all_gather,broadcast,all_to_all"),
      "comma-separated collectives")("min-bytes", po::value(&min_bytes)->default_value(1 << 20),
                                     "smallest buffer")(
      "max-bytes", po::value(&max_bytes)->default_value(int64_t{1} << 30), "largest buffer")(
      "iters", po::value(&iters)->default_value(20), "timed runs per size")(
      "warmup", po::value(&warmup)->default_value(5), "untimed runs first")(
      "check", "exit 1 if any result is wrong")("local_rank", po::value<int>(),
                                                "set by the launcher");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "comm_bench: " << e.what() << "\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  dscpp::comm::InitOptions init;
  init.backend = backend;
  auto pg = dscpp::comm::init_distributed(init);
  auto env = dscpp::comm::read_dist_env();
  at::ScalarType st = dtype == "fp32" ? at::kFloat : dtype == "fp16" ? at::kHalf : at::kBFloat16;
  at::Device device =
      pg->backend_name() == "nccl" ? at::Device(at::kCUDA, env.local_rank) : at::Device(at::kCPU);
  Bench b{pg, at::TensorOptions().dtype(st).device(device), iters, warmup, pg->size(), pg->rank()};
  std::vector<std::string> ops;
  for (size_t s = 0, e; s <= ops_arg.size(); s = e + 1) {
    e = ops_arg.find(',', s);
    if (e == std::string::npos) e = ops_arg.size();
    if (e > s) ops.push_back(ops_arg.substr(s, e - s));
  }
  if (b.r == 0)
    std::cout << fmt::format("# comm_bench: {} ranks, {}, {}, {} iters\n", b.n, pg->backend_name(),
                             dtype, iters)
              << fmt::format("{:>15} {:>9} {:>11} {:>13} {:>13} {:>6}\n", "op", "size", "time_us",
                             "algbw_GB/s", "busbw_GB/s", "check");
  bool all_ok = true;
  for (const auto& op : ops) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      auto [secs, ok] = b.run(op, bytes);
      // Every rank's verdict counts: the result is wrong if it is wrong anywhere.
      at::Tensor bad = at::full({1}, ok ? 0.0f : 1.0f, at::TensorOptions().device(device));
      pg->all_reduce(bad, ReduceOp::kMax).wait();
      ok = bad.cpu().item<float>() == 0.0f;
      all_ok = all_ok && ok;
      double algbw = bytes / secs / 1e9;
      if (b.r == 0)
        std::cout << fmt::format("{:>15} {:>9} {:>11.1f} {:>13.2f} {:>13.2f} {:>6}\n", op,
                                 human(bytes), secs * 1e6, algbw, algbw * b.bus_factor(op),
                                 ok ? "ok" : "WRONG");
    }
  }
  pg->barrier().wait();
  if (vm.count("check") && !all_ok) return 1;
  return 0;
}
