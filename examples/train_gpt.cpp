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
//
// --profile-step N --profile-out trace.json records optimizer step N (1-based, as the log counts)
// with LibTorch's Kineto profiler (CPU ops, and CUDA kernels through CUPTI on a GPU) and saves a
// Chrome trace (plain JSON; gzip it for bench/trace_summary.py or keep it plain). Rank 0 only, or
// every rank to PATH with "-rank<R>" before the extension with --profile-all-ranks. The step is
// bracketed by device synchronisations and left out of its interval's tokens/s; its loss still
// counts. The step carries user scopes train_gpt::step, ::forward, ::backward, ::optimizer.
// --profile-steps K records K consecutive steps from N into the one trace, with no
// synchronisation between them: what a step leaves in flight (dscpp_deferred_allgather's
// all-gathers) shows against the next step's forward.
//
// --memory-snapshot PATH (CUDA) records the caching allocator's history (C++ stacks included)
// from the start of step --memory-snapshot-step (default 2: the first step allocates what
// stays) to its end, and writes the pickle torch.cuda.memory._dump_snapshot would write
// (https://pytorch.org/memory_viz, or bench/memory_peak.py for the live blocks at the peak).
//
// --bench-no-comm hands the engine a no-op process group shaped like the world group
// (comm/no_op_group.h): every rank keeps its layout and kernels but no collective moves data,
// so the step time is the bound overlap_comm is measured against (bench/rows.toml's
// gpt1b3-dscpp-z2-x2-nocomm row). The model does not train correctly, and the logged loss is
// rank 0's own.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "dry_run.h"
#include "dscpp/comm/error_text.h"
#include "dscpp/comm/no_op_group.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "dscpp/config/config_error.h"
#include "dscpp/config/json_text.h"
#include "dscpp/data/data_error.h"
#include "dscpp/data/data_loader.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/nn/rng_tracker.h"
#include "dscpp/ops/grad_destination.h"
#include "dscpp/ops/grouped_weight_grad.h"
#include "dscpp/pipe/partition.h"
#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/monitor/monitor.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "gpt_flags.h"
#include "job_groups.h"
#include "moe_training.h"
#include "non_finite_check.h"
#include "step_recording.h"
#include "train_gpt_checkpoint.h"
#include "train_gpt_log.h"
#include "train_gpt_pipeline.h"

// (step_recording.h's device waits and profiles, job_groups.h's groups)
using namespace dscpp::examples;  // NOLINT(google-build-using-namespace)

namespace {

// When main began: the start-up line says how long building the model and initialising the
// engine took (a large model's start-up is most of a short run).
std::chrono::steady_clock::time_point program_start;
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

using Args = dscpp::examples::GptOptions;

using dscpp::examples::peak_memory;

// A batch onto the engine's device. On a GPU through pinned memory and without blocking: a
// pageable copy would hold the host until the stream's queued work (the last step's optimizer)
// has run, and the next forward could not be queued behind it.
at::Tensor to_device(const at::Tensor& t, at::Device device) {
  if (!device.is_cuda()) return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

// GPT's loss for the module trained, through the engine's forward: the GPT module's and the
// layers' forward(input, target) where it tiles the loss (the layers: their head's), the
// tensor-parallel one's vocabulary-parallel loss (its logits never gathered), else gpt_loss.
template <typename Model, typename Engine>
at::Tensor loss_of(Engine& engine, const at::Tensor& input, const at::Tensor& target,
                   const dscpp::model_zoo::GPTConfig& cfg) {
  if constexpr (std::is_same_v<Model, dscpp::model_zoo::TensorParallelGPT>) {
    return engine.module()->loss(engine.forward(input), target);
  } else {
    if (std::is_same_v<Model, dscpp::model_zoo::GPT> || cfg.tiled_logits_loss_shards > 1)
      return engine.forward(input, target);
    return dscpp::model_zoo::gpt_loss(engine.forward(input), target, cfg.cross_entropy_loss_fusion);
  }
}

// The training loop, for the GPT module, its LayerSpec form (a LayerModule) or the
// tensor-parallel GPT (with `groups`); with a sequence-parallel group (DeepSpeed-Ulysses) each
// rank trains on its slice of the sequences of its data rank's batch.
template <typename Model>
int train(const Args& args, const dscpp::model_zoo::GPTConfig& cfg, Model model,
          const nlohmann::json& ds_config, const JobGroups& groups) {
  const auto& sequence_group = groups.sequence;
  const double built_s = seconds_since(program_start);
  const auto init_start = std::chrono::steady_clock::now();
  dscpp::InitArgs init;
  if (groups.model) {
    init.group = groups.data;  // ZeRO and the data loader: the data-parallel ranks
    init.model_group = groups.model;
  } else if (args.bench_no_comm) {
    init.group = dscpp::comm::make_no_op_group(*dscpp::comm::init_distributed());
    if (init.group->rank() == 0)
      std::cout << "[train_gpt] --bench-no-comm: a no-op process group; ZeRO's gradient "
                   "reductions and parameter all-gathers move no data, the model does not train "
                   "correctly, only the step time means something\n";
  }
  // The data group's holder: the MoE expert biases sum their counts over it.
  auto data_group = init.group ? init.group : dscpp::comm::init_distributed();
  auto engine = dscpp::initialize(model, ds_config, std::move(init));
  if (!cfg.fp8.empty()) dscpp::nn::check_fp8_usable(engine.device(), engine.config().fp16.enabled);
  // With sequence parallelism the aux losses are each tensor rank's part (nn/moe/router.h).
  dscpp::examples::MoETraining moe(
      cfg, *model, data_group, engine.device(), nullptr, 1,
      cfg.parallelism.sequence_parallel ? groups.model : sequence_group);
  const double init_s = seconds_since(init_start);
  // With sequence parallelism the engine's group holds sp ranks per data rank (the sequence
  // axis fastest); they read the same batch.
  const int sp = sequence_group ? sequence_group->size() : 1;
  const int dp_rank = engine.global_rank() / sp, world = engine.world_size() / sp;
  // The job's rank, for what one rank prints or profiles: with tensor parallelism t ranks share
  // a place in the engine's group (the layout data x sequence x model, the model axis fastest).
  const int tp = groups.model ? groups.model->size() : 1;
  const int rank = engine.global_rank() * tp + (groups.model ? groups.model->rank() : 0);
  const auto& ds = engine.config();
  // The GPT module's checkpointed blocks take the ds_config's activation_checkpointing options
  // (cpu_checkpointing: the saved inputs in page-locked host memory; number_checkpoints).
  if constexpr (std::is_same_v<Model, dscpp::model_zoo::GPT>) {
    if (cfg.checkpoint_activations)
      model->enable_activation_checkpointing(ds.activation_checkpointing);
  }
  // Dropout in the split regions draws under the model-parallel tracker's fork (differing
  // across tensor ranks), the replicated regions' from the default generator (agreeing), as
  // on a pipeline; before --load, which restores both on the layout they were saved on.
  if (groups.model)
    dscpp::nn::model_parallel_cuda_manual_seed(static_cast<uint64_t>(args.seed),
                                               groups.model->rank(), engine.device());

  int64_t first = 0;
  if (!args.load.empty()) {
    auto r = engine.load_checkpoint(args.load);  // warns (rank 0) when there is no `latest`
    first = engine.global_steps();
    if (rank == 0)
      std::cout << (r.path.empty()
                        ? fmt::format("[train_gpt] no checkpoint in {}: starting from scratch\n",
                                      args.load)
                        : fmt::format("[train_gpt] resumed from {} at step {}\n", r.path, first));
  }

  if (first >= args.train_iters) {
    // A finished run resumed: nothing to do, and the user should learn why and what next.
    if (rank == 0)
      std::cout << dscpp::examples::finished_line(first, args.train_iters, ds_config) << std::flush;
    return 0;
  }

  auto indexed = std::make_shared<dscpp::data::IndexedDataset>(args.data_path);
  auto dataset = std::make_shared<dscpp::data::GPTDataset>(
      indexed,
      // vocab_size: a token id the embedding has no row for is refused here, naming the file,
      // document and id, not deep in the first forward.
      dscpp::data::GPTDatasetOptions{cfg.seq_length, static_cast<uint64_t>(args.seed), true,
                                     cfg.vocab_size});
  const int64_t mb = engine.train_micro_batch_size_per_gpu(),
                ga = engine.gradient_accumulation_steps();
  dscpp::data::DataLoaderOptions lo;
  lo.micro_batch_size = mb;
  lo.rank = dp_rank;
  lo.world_size = world;
  lo.num_epochs = 0;            // as many epochs as the iterations need
  lo.start_batch = first * ga;  // resume where the checkpoint's data left off
  dscpp::data::DataLoader loader(dataset, lo);
  if (loader.batches_per_epoch() == 0)
    throw dscpp::data::DataError(args.data_path,
                                 fmt::format("{} tokens make no batch of {} x {} tokens per rank",
                                             indexed->num_tokens(), mb, cfg.seq_length + 1));

  const double flops_per_token = cfg.flops_per_token(cfg.seq_length);
  const double peak = args.peak_tflops > 0        ? args.peak_tflops
                      : engine.device().is_cuda() ? 989.0
                                                  : 0.0;
  const int64_t tokens_per_step = ds.train_batch_size * cfg.seq_length;
  if (rank == 0)
    std::cout
        << fmt::format(
               "[train_gpt] GPT {:.2f}M parameters{} (L={} h={} heads={} seq={} vocab={}); {} "
               "ranks on {}, "
               "ZeRO stage {}, {}; global batch {} = {} x {} x {}; data {} tokens, {} "
               "batches per rank "
               "per epoch\n",
               cfg.num_parameters() / 1e6, dscpp::examples::moe_parameter_fields(cfg),
               cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.seq_length,
               cfg.vocab_size, world * tp * sp, engine.device().str(),
               engine.zero_optimization_stage(), at::toString(engine.dtype()), ds.train_batch_size,
               mb, ga, world, indexed->num_tokens(), loader.batches_per_epoch())
        << (cfg.parallelism.tensor_model_parallel_size > 1
                ? fmt::format("[train_gpt] tensor parallel {} x data {}{}\n",
                              cfg.parallelism.tensor_model_parallel_size, world,
                              cfg.parallelism.sequence_parallel ? ", sequence parallel" : "")
                : std::string())
        << (sp > 1 ? fmt::format("[train_gpt] DeepSpeed-Ulysses: sequence parallel {} x data {}; "
                                 "each rank {} tokens of each sequence\n",
                                 sp, world, cfg.seq_length / sp)
                   : std::string())
        << fmt::format(
               "[train_gpt] start-up: model built in {:.1f} s, engine initialised in "
               "{:.1f} s; {}",
               built_s, init_s, peak_memory(engine.device()))
        << std::endl;

  auto save = [&](int64_t step) {
    const bool saved = dscpp::examples::save_checkpoint_or(
        [&] {
          engine.save_checkpoint(
              args.save, "", dscpp::examples::train_gpt_client_state(step, ds.train_batch_size));
        },
        args.on_save_error, step, rank);
    if (saved && rank == 0)
      std::cout << fmt::format("[train_gpt] saved {}/global_step{}\n", args.save, step)
                << std::flush;
  };

  const bool profiling_rank = rank == 0 || args.profile_all_ranks;
  std::optional<StepProfiler> profiler;
  if (args.profile_step > 0 && profiling_rank)
    profiler.emplace(engine.device(), profile_path(args.profile_out, rank, args.profile_all_ranks));

  at::Tensor interval_loss =
      at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(engine.device()));
  int64_t interval_steps = 0, timed_steps = 0;
  // A non-finite loss or gradient norm: tested on the device each step, read at each log line
  // and before each save (a collective over the world: every rank stops, or none).
  dscpp::examples::NonFiniteCheck non_finite(engine.device());
  const auto world_group = dscpp::comm::init_distributed();
  bool non_finite_reported = false;
  auto check_non_finite = [&] {
    const auto found = non_finite.take(*world_group);
    if (!found.any() || non_finite_reported) return;
    if (args.check_for_nan_in_loss_and_grad)
      throw dscpp::examples::NonFiniteError(
          found.describe() +
          "; stopped by --check-for-nan-in-loss-and-grad (the default; "
          "--no-check-for-nan-in-loss-and-grad reports it and trains on)");
    if (rank == 0)
      std::cout << "[train_gpt] warning: " << found.describe()
                << "; training goes on (--no-check-for-nan-in-loss-and-grad)" << std::endl;
    non_finite_reported = true;
  };
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = first; step < args.train_iters; ++step) {
    const int64_t done = step + 1;
    const bool profiled = args.profile_step > 0 && done >= args.profile_step &&
                          done < args.profile_step + args.profile_steps;
    const bool snapshot = !args.memory_snapshot.empty() && done == args.memory_snapshot_step;
    const bool untimed = profiled || snapshot;
    // The steps before keep their queued kernels inside their own timing.
    if (untimed && (snapshot || done == args.profile_step)) device_sync(engine.device());
    const auto p0 = std::chrono::steady_clock::now();
    if (profiled && done == args.profile_step && profiler) profiler->start();
    if (snapshot && rank == 0) memory_history(engine.device(), true);
    {
      RECORD_USER_SCOPE("train_gpt::step");
      at::Tensor step_loss;  // the mean over this rank's micro-batches, on the device
      for (int64_t m = 0; m < ga; ++m) {
        auto batch = loader.next();
        at::Tensor input = to_device(dscpp::model_zoo::sequence_slice(batch->input, sequence_group),
                                     engine.device()),
                   target =
                       to_device(dscpp::model_zoo::sequence_slice(batch->target, sequence_group),
                                 engine.device());
        at::Tensor loss, total;
        {
          RECORD_USER_SCOPE("train_gpt::forward");
          // The MoE blocks' aux losses (scaled by their coefficients) join the loss here.
          dscpp::nn::AuxLossScope aux;
          total = loss = dscpp::model_zoo::sequence_parallel_loss(
              loss_of<Model>(engine, input, target, cfg), target, sequence_group);
          if (aux.sum().defined()) total = loss + aux.sum();
          moe.add_aux(aux.sum(), ga);
        }
        {
          RECORD_USER_SCOPE("train_gpt::backward");
          engine.backward(total);
        }
        {
          RECORD_USER_SCOPE("train_gpt::optimizer");
          engine.step();
        }
        // (a sequence rank's loss is its share: sp times it averages to the sequences' mean)
        const at::Tensor part = loss.detach().to(at::kDouble) * sp / ga;
        step_loss = step_loss.defined() ? step_loss + part : part;
      }
      interval_loss += step_loss;
      non_finite.after_step(done, step_loss, engine.core().global_grad_norm_tensor(),
                            engine.core().was_step_applied());
      moe.after_boundary();  // the expert biases, from the global batch's routing
    }
    if (step == first && rank == 0)  // (ZeRO's buffers are laid out by the first backward)
      std::cout << "[train_gpt] engine buffers: "
                << dscpp::zero::describe(engine.core().memory_breakdown()) << std::endl;
    ++interval_steps;
    if (untimed) {
      // Out of the interval's timing: the profiled steps, their synchronisations and the saves.
      if (profiled && done == args.profile_step + args.profile_steps - 1 && profiler) {
        profiler->stop();
        std::cout << fmt::format("[train_gpt] rank {} profiled steps {}-{} into {}\n", rank,
                                 args.profile_step, done,
                                 profile_path(args.profile_out, rank, args.profile_all_ranks))
                  << std::flush;
      }
      if (snapshot && rank == 0) {
        device_sync(engine.device());
        write_memory_snapshot(args.memory_snapshot);
        memory_history(engine.device(), false);
        std::cout << fmt::format("[train_gpt] memory history of step {} in {}\n", done,
                                 args.memory_snapshot)
                  << std::flush;
      }
      t0 += std::chrono::steady_clock::now() - p0;
    } else {
      ++timed_steps;
    }
    if (done % args.log_interval == 0 || done == args.train_iters) {
      // The interval ends when its queued kernels have run (the last step's optimizer is
      // still on the device when the host gets here), as every benchmark row's does.
      device_sync(engine.device());
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // One all-reduce per log line: the mean loss over ranks, micro-batches and steps.
      at::Tensor l = interval_loss / interval_steps;
      engine.data_parallel_group().all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
      const double tokens_per_s = timed_steps * tokens_per_step / secs;
      const double tflops = tokens_per_s * flops_per_token / (world * sp) / 1e12;
      const std::string moe_fields = moe.interval_report(interval_steps);  // collective
      if (rank == 0) {
        dscpp::examples::IntervalFigures f;
        f.step = done;
        f.train_iters = args.train_iters;
        f.loss = l.item<double>();
        f.lr = engine.get_lr()[0];
        f.grad_norm = engine.get_global_grad_norm();
        f.loss_scale = engine.loss_scale();
        f.tokens_per_s = tokens_per_s;
        f.ranks = world * sp;
        f.tflops_per_rank = tflops;
        f.peak_tflops = peak;
        f.moe = moe.active();
        f.moe_fields = moe_fields;
        std::cout << "[train_gpt] " << dscpp::examples::interval_fields(f, engine.device()) << "\n"
                  << std::flush;
      }
      // What only the program knows, beside the engine's own events (docs/monitor.md).
      if (engine.monitor_enabled()) {
        const int64_t x = engine.global_samples();
        std::vector<dscpp::monitor::Event> events = {
            {"Train/Samples/tokens_per_sec", tokens_per_s, x},
            {"Train/Samples/tflops_per_rank", tflops, x}};
        if (peak > 0) events.push_back({"Train/Samples/mfu", tflops / peak, x});
        engine.write_monitor_events(events);
      }
      interval_loss.zero_();
      interval_steps = timed_steps = 0;
      t0 = std::chrono::steady_clock::now();
      check_non_finite();  // after the line: it shows the interval's loss
    }
    if (!args.save.empty() && args.save_interval > 0 && done % args.save_interval == 0) {
      check_non_finite();  // a diverged run saves no checkpoint over a good one
      save(done);
    }
  }
  if (!args.save.empty() &&
      (args.save_interval <= 0 || args.train_iters % args.save_interval != 0) &&
      engine.global_steps() > first) {
    check_non_finite();
    save(engine.global_steps());
  }

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
}

// The tensor degree and sequence parallelism from the flags into the model config's
// `parallelism` (a flag and the config naming different degrees: an error), then the
// world-size arithmetic (an error shows it).
void apply_tensor_flags(dscpp::model_zoo::GPTConfig& cfg, const Args& args, int64_t world) {
  auto& par = cfg.parallelism;
  if (args.tensor_model_parallel_size > 1) {
    if (par.tensor_model_parallel_size > 1 &&
        par.tensor_model_parallel_size != args.tensor_model_parallel_size)
      throw dscpp::examples::FlagError(fmt::format(
          "tensor degree: the model config's parallelism.tensor_model_parallel_size is {} but "
          "--tensor-model-parallel-size is {}; give one, or the same",
          par.tensor_model_parallel_size, args.tensor_model_parallel_size));
    par.tensor_model_parallel_size = args.tensor_model_parallel_size;
  }
  par.sequence_parallel = par.sequence_parallel || args.sequence_parallel;
  if (par.sequence_parallel && par.tensor_model_parallel_size == 1)
    throw dscpp::examples::FlagError(
        "--sequence-parallel (or the model config's sequence_parallel) needs a tensor degree > "
        "1 (--tensor-model-parallel-size)");
  (void)dscpp::examples::resolve_layout(cfg, world);
  if (par.tensor_model_parallel_size > 1 && (args.layer_specs || args.seed_layers))
    throw dscpp::examples::FlagError(
        "--layer-specs / --seed-layers: not with tensor parallelism yet (the tensor-parallel "
        "GPT is one module)");
  if (par.tensor_model_parallel_size > 1 && args.bench_no_comm)
    throw dscpp::examples::FlagError("--bench-no-comm: not with tensor parallelism");
}

// An error every rank meets alike (the command line, the configs, the data files, a
// non-finite loss all ranks agree on): rank 0 prints it and exits; another rank waits first,
// so that the launcher, which stops the job at the first rank to exit, stops it before it
// prints a copy. The wait is long beside a loaded machine's start-up skew between ranks (8
// ranks on 2 cores start seconds apart), so that a rank that met the error early does not
// print before rank 0 has. Should rank 0 not have met the error (a file missing on one node
// only), the other rank still prints it, with its rank, after the wait.
int report_once(bool quiet, int rank, const std::string& what, int status) {
  if (quiet) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::cerr << "train_gpt (rank " << rank << "): " << what << "\n" << std::flush;
  } else {
    std::cerr << "train_gpt: " << what << "\n" << std::flush;
  }
  return status;
}

}  // namespace

// An error found before the ranks meet (the command line, the configs), and one of the ds_config
// or the data found after, is the same on every rank: rank 0 prints it, the others exit with the
// same status (report_once).
int main(int argc, char** argv) {
  program_start = std::chrono::steady_clock::now();
  // A reader that closed its end of our output (`train_gpt | head`) makes a write fail
  // quietly (std::cout and std::cerr do not throw), not kill the rank in the middle of a step
  // or of a checkpoint's save: the run goes on to its end.
  std::signal(SIGPIPE, SIG_IGN);
  bool quiet = false, launched = false;
  int64_t world = 1;
  int rank = 0;
  try {
    const auto env = dscpp::comm::read_dist_env();
    rank = env.rank;
    quiet = env.rank != 0;
    world = env.world_size;
    // --dry-run on one machine without the launcher takes the config's own degrees.
    launched = std::getenv("RANK") != nullptr || std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
  } catch (const std::exception&) {
    // A broken launch environment is the rendezvous's to report, with its variable named.
  }
  Args args;
  std::optional<dscpp::model_zoo::GPTConfig> cfg;
  nlohmann::json ds_config;
  dscpp::examples::JobLayout layout;
  try {
    args = dscpp::examples::parse_gpt_flags(argc, argv);
    if (args.help) {
      if (!quiet) std::cout << args.help_text << "\n";
      return 0;
    }
    if (args.dry_run) return dscpp::examples::run_dry_run(args, launched ? world : 0, quiet);
    try {
      dscpp::ops::set_grouped_weight_grad_mode(
          dscpp::ops::parse_grouped_weight_grad_mode(args.grouped_wgrad));
    } catch (const dscpp::Error& e) {
      throw dscpp::examples::FlagError(std::string("--grouped-wgrad: ") + e.what());
    }
    cfg = dscpp::model_zoo::GPTConfig::from_file(args.model_config);
    apply_tensor_flags(*cfg, args, world);
    // A pipeline (train_gpt_pipeline.h) leaves world / (stages x tensor) ranks to data
    // parallelism, and runs tensor parallelism itself.
    const auto raw = dscpp::config::read_config(args.ds_config);
    layout = dscpp::examples::job_layout(*cfg, raw, args, world);
    ds_config = dscpp::examples::apply_gpt_flags(raw, args, layout.data);
    dscpp::examples::require_optimizer(ds_config);
    // DeepSpeed-Ulysses: the model splits each sequence, the engine's batch rule counts data
    // ranks only and its gradients sum the sequence ranks' shares.
    cfg->parallelism.sequence_parallel_size = layout.sequence;
    if (layout.sequence > 1) ds_config["sequence_parallel_size"] = layout.sequence;
  } catch (const dscpp::examples::FlagError& e) {
    return report_once(quiet, rank, e.what(), 2);
  } catch (const std::exception& e) {
    return report_once(quiet, rank, dscpp::comm::error_text(e), 1);
  }
  try {
    at::manual_seed(static_cast<uint64_t>(args.seed));
    // The model config's switch for the linears' writes into ZeRO's buckets.
    dscpp::ops::set_gradient_accumulation_fusion(cfg->gradient_accumulation_fusion);
    if (layout.pipeline > 1)
      return dscpp::examples::train_gpt_pipeline(args, *cfg, ds_config, layout);
    if ((args.pipeline_schedule && *args.pipeline_schedule != "auto") ||
        cfg->parallelism.pipeline_parallel_schedule != "auto")
      throw dscpp::examples::FlagError(
          "a pipeline schedule (--pipeline-schedule, parallelism.pipeline_parallel_schedule) "
          "needs a pipeline: the pipeline degree is 1");
    // ZeRO stage 3 gathers a model given as layers one layer at a time, and any other module
    // whole: the GPT goes in as its LayerSpecs there (the same modules, names and numerics).
    // (A malformed stage is left for the engine's config reader to report.)
    const auto zero = ds_config.find("zero_optimization");
    const bool stage3 = zero != ds_config.end() && zero->is_object() && zero->contains("stage") &&
                        (*zero)["stage"].is_number_integer() && (*zero)["stage"] == 3;
    const bool layered = stage3 || args.layer_specs || args.seed_layers;
    const int64_t t = cfg->parallelism.tensor_model_parallel_size;
    const JobGroups groups = job_groups(t, layout.sequence);
    if (t > 1) {
      // At stage 3 TensorParallelGPT is gathered as a whole (over the data group), its
      // LayerSpecs having no sequence parallelism.
      // An MoE model's expert-parallel groups split the data group of each tensor rank
      // (DeepSpeed's layout with an mpu); null at expert degree 1.
      const auto ep_group = dscpp::examples::expert_parallel_group(
          *cfg, dscpp::comm::Topology({"pipe", "data", "model"},
                                      {1, static_cast<int>(world / t), static_cast<int>(t)}));
      at::manual_seed(static_cast<uint64_t>(args.seed));  // the same master weights on all
      return train(
          args, *cfg,
          dscpp::model_zoo::TensorParallelGPT(*cfg, groups.model, ep_group, groups.sequence),
          ds_config, groups);
    }
    const auto& sequence_group = groups.sequence;
    if (layered) {
      // An MoE model's expert-parallel group (null at expert degree 1) goes to its MoE blocks.
      // (each checkpointed block its own segment, with the ds_config's checkpointing options)
      auto specs = dscpp::model_zoo::gpt_layer_specs(
          *cfg, dscpp::examples::expert_parallel_group(*cfg), sequence_group,
          dscpp::activation_checkpointing::options_from_config(
              dscpp::read_activation_checkpointing_section(ds_config)));
      // --seed-layers: the weights a pipeline of any number of stages starts from.
      if (args.seed_layers)
        specs = dscpp::examples::seeded_layer_specs(std::move(specs), args.seed);
      return train(args, *cfg, dscpp::nn::LayerModule(specs), ds_config, groups);
    }
    // An MoE model's expert-parallel group (null at expert degree 1) goes to its MoE layers.
    return train(
        args, *cfg,
        dscpp::model_zoo::GPT(*cfg, dscpp::examples::expert_parallel_group(*cfg), sequence_group),
        ds_config, groups);
  } catch (const dscpp::examples::FlagError& e) {
    return report_once(quiet, rank, e.what(), 2);
  } catch (const dscpp::ConfigError& e) {  // the engine's reading of the ds_config
    return report_once(quiet, rank, e.what(), 1);
  } catch (const dscpp::data::DataError& e) {  // the data files, the same on every rank
    return report_once(quiet, rank, e.what(), 1);
  } catch (const dscpp::examples::NonFiniteError& e) {  // agreed by a collective
    return report_once(quiet, rank, e.what(), 1);
  } catch (const dscpp::LossScaleAtMinimumError& e) {  // fp16's scale: the same on every rank
    return report_once(quiet, rank, e.what(), 1);
  } catch (const dscpp::checkpoint::CheckpointError& e) {  // --load's files, the same on every rank
    return report_once(quiet, rank, e.what(), 1);
  } catch (const dscpp::pipe::PartitionError& e) {  // the pipeline's partition of the layers
    return report_once(quiet, rank, e.what(), 1);
  } catch (const std::exception& e) {
    // Anything else may be this rank's alone: each rank says it, without the C++ backtrace
    // a c10::Error's what() carries after the message.
    std::cerr << "train_gpt: " << dscpp::comm::error_text(e) << "\n";
    return 1;
  }
}
