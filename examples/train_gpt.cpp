// train_gpt: GPT pre-training on a Megatron indexed dataset with the dscpp engine, the way a
// practitioner runs a scaled-down job before scaling out:
//
//   dscpp --num_gpus N build/examples/train_gpt --model-config model_zoo/configs/gpt_tiny.json
//       --train-data-path runs/corpus/fortunes_text_document --deepspeed_config ds_configs/X.json
//       --train-iters 200 --save runs/ckpt --save-interval 50 --load runs/ckpt --log-interval 10
//
// Rank 0 logs every --log-interval optimizer steps: loss (mean over ranks and micro-batches),
// lr, grad norm, loss scale, tokens/s, TFLOP/s per rank and MFU (model FLOPs 6N + 12*L*h*s per
// token over --peak-tflops), and peak memory. --load resumes weights, optimizer, schedule,
// counters and the data position from the checkpoint's latest tag when there is one.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "dscpp.h"
#include "model_zoo/gpt.h"
#include "runtime/checkpoint/ds_layout.h"
#include "runtime/data/data_loader.h"
#include "runtime/monitor/monitor.h"
#ifdef DSCPP_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace po = boost::program_options;

namespace {

struct Args {
  std::string model_config, data_path, ds_config, save, load;
  int64_t train_iters = 100, save_interval = 0, log_interval = 10, seed = 1234;
  double peak_tflops = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  po::options_description o("train_gpt options");
  o.add_options()("help,h", "this text")("model-config", po::value(&a.model_config)->required(),
                                         "GPT config (JSON)")(
      "train-data-path", po::value(&a.data_path)->required(),
      "indexed dataset prefix (PREFIX.bin / PREFIX.idx, from tools/preprocess_data)")(
      "deepspeed_config", po::value(&a.ds_config)->required(), "ds_config JSON")(
      "train-iters", po::value(&a.train_iters)->default_value(100), "optimizer steps in all")(
      "save", po::value(&a.save), "checkpoint folder to save to")(
      "save-interval", po::value(&a.save_interval)->default_value(0),
      "save every K steps (0: only at the end, when --save is given)")(
      "load", po::value(&a.load), "checkpoint folder to resume from (if it holds one)")(
      "log-interval", po::value(&a.log_interval)->default_value(10), "log every K steps")(
      "seed", po::value(&a.seed)->default_value(1234), "initialisation and data order")(
      "peak-tflops", po::value(&a.peak_tflops)->default_value(0),
      "a rank's peak TFLOP/s for MFU (0: 989 on a CUDA device, the H100/H200 bf16 dense "
      "peak; none on the CPU)")("local_rank", po::value<int>(), "set by the launcher");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, o), vm);
  if (vm.count("help")) {
    std::cout << o << "\n";
    std::exit(0);
  }
  po::notify(vm);
  return a;
}

// Peak memory of this process: the CUDA caching allocator's peak on a GPU, the resident
// high-water mark (VmHWM) on the CPU.
std::string peak_memory(at::Device device) {
#ifdef DSCPP_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& peak =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    return fmt::format("{:.2f} GiB allocated (peak)", peak / double(1 << 30));
  }
#endif
  (void)device;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      return fmt::format("{:.2f} GiB resident (peak)",
                         std::stod(line.substr(6)) / (1024.0 * 1024.0));
    }
  return "n/a";
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  at::manual_seed(static_cast<uint64_t>(args.seed));
  auto cfg = dscpp::model_zoo::GPTConfig::from_file(args.model_config);
  dscpp::model_zoo::GPT model(cfg);
  auto engine = dscpp::initialize(model, args.ds_config);
  const int rank = engine.global_rank(), world = engine.world_size();
  const auto& ds = engine.core().config();

  int64_t first = 0;
  if (!args.load.empty() && dscpp::checkpoint::read_latest(args.load)) {
    auto r = engine.load_checkpoint(args.load);
    first = engine.global_steps();
    if (rank == 0)
      std::cout << fmt::format("[train_gpt] resumed from {} at step {}\n", r.path, first);
  }

  auto indexed = std::make_shared<dscpp::data::IndexedDataset>(args.data_path);
  auto dataset = std::make_shared<dscpp::data::GPTDataset>(
      indexed,
      dscpp::data::GPTDatasetOptions{cfg.seq_length, static_cast<uint64_t>(args.seed), true});
  const int64_t mb = engine.train_micro_batch_size_per_gpu(),
                ga = engine.gradient_accumulation_steps();
  dscpp::data::DataLoaderOptions lo;
  lo.micro_batch_size = mb;
  lo.rank = rank;
  lo.world_size = world;
  lo.num_epochs = 0;            // as many epochs as the iterations need
  lo.start_batch = first * ga;  // resume where the checkpoint's data left off
  dscpp::data::DataLoader loader(dataset, lo);
  if (loader.batches_per_epoch() == 0)
    throw std::runtime_error(fmt::format("{}: {} tokens make no batch of {} x {} tokens per rank",
                                         args.data_path, indexed->num_tokens(), mb,
                                         cfg.seq_length + 1));

  const double flops_per_token = cfg.flops_per_token(cfg.seq_length);
  const double peak = args.peak_tflops > 0        ? args.peak_tflops
                      : engine.device().is_cuda() ? 989.0
                                                  : 0.0;
  const int64_t tokens_per_step = ds.train_batch_size * cfg.seq_length;
  if (rank == 0)
    std::cout << fmt::format(
                     "[train_gpt] GPT {:.2f}M parameters (L={} h={} heads={} seq={} vocab={}); {} "
                     "ranks on {}, "
                     "ZeRO stage {}, {}; global batch {} = {} x {} x {}; data {} tokens, {} "
                     "batches per rank "
                     "per epoch\n",
                     cfg.num_parameters() / 1e6, cfg.num_layers, cfg.hidden_size,
                     cfg.num_attention_heads, cfg.seq_length, cfg.vocab_size, world,
                     engine.device().str(), engine.zero_optimization_stage(),
                     at::toString(engine.core().dtype()), ds.train_batch_size, mb, ga, world,
                     indexed->num_tokens(), loader.batches_per_epoch())
              << std::flush;

  auto save = [&](int64_t step) {
    auto client = dscpp::checkpoint::PyValue::dict();
    client.set("iteration", step);
    client.set("consumed_samples", step * ds.train_batch_size);
    engine.save_checkpoint(args.save, "", client);
    if (rank == 0)
      std::cout << fmt::format("[train_gpt] saved {}/global_step{}\n", args.save, step)
                << std::flush;
  };

  at::Tensor interval_loss =
      at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(engine.device()));
  int64_t interval_steps = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = first; step < args.train_iters; ++step) {
    for (int64_t m = 0; m < ga; ++m) {
      auto batch = loader.next();
      at::Tensor input = batch->input.to(engine.device()),
                 target = batch->target.to(engine.device());
      at::Tensor loss = model->loss(engine.forward(input), target);
      engine.backward(loss);
      engine.step();
      interval_loss += loss.detach().to(at::kDouble) / ga;
    }
    ++interval_steps;
    const int64_t done = step + 1;
    if (done % args.log_interval == 0 || done == args.train_iters) {
      // One all-reduce per log line: the mean loss over ranks, micro-batches and steps.
      at::Tensor l = interval_loss / interval_steps;
      engine.core().group().all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tokens_per_s = interval_steps * tokens_per_step / secs;
      const double tflops = tokens_per_s * flops_per_token / world / 1e12;
      if (rank == 0)
        std::cout << fmt::format(
                         "[train_gpt] step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | "
                         "loss scale {:g} | {:.0f} tokens/s ({:.0f} per rank) | {:.3f} TFLOP/s per "
                         "rank | MFU {} | {}\n",
                         done, args.train_iters, l.item<double>(), engine.get_lr()[0],
                         engine.get_global_grad_norm(), engine.loss_scale(), tokens_per_s,
                         tokens_per_s / world, tflops,
                         peak > 0 ? fmt::format("{:.1f}%", 100 * tflops / peak)
                                  : std::string("n/a"),
                         peak_memory(engine.device()))
                  << std::flush;
      interval_loss.zero_();
      interval_steps = 0;
      t0 = std::chrono::steady_clock::now();
    }
    if (!args.save.empty() && args.save_interval > 0 && done % args.save_interval == 0) save(done);
  }
  if (!args.save.empty() &&
      (args.save_interval <= 0 || args.train_iters % args.save_interval != 0) &&
      engine.global_steps() > first)
    save(engine.global_steps());

  if (rank == 0) {
    std::cout << "[train_gpt] done. Logs: the lines above";
    if (ds.tensorboard.enabled)
      std::cout
          << "; TensorBoard: "
          << std::filesystem::absolute(dscpp::monitor::monitor_log_dir(ds.tensorboard)).string();
    if (ds.csv_monitor.enabled)
      std::cout
          << "; CSV: "
          << std::filesystem::absolute(dscpp::monitor::monitor_log_dir(ds.csv_monitor)).string();
    if (!args.save.empty())
      std::cout << "; checkpoint: " << std::filesystem::absolute(args.save).string();
    std::cout << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "train_gpt: " << e.what() << "\n";
  return 1;
}
