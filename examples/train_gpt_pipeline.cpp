// train_gpt on a pipeline: see train_gpt_pipeline.h. The log lines (and monitor events) are
// train_gpt.cpp's, with the bubble added, and so are --save / --save-interval / --load
// (PipelineEngine's checkpoints); what a pipeline run cannot do yet is refused by name.
#include "train_gpt_pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <utility>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/config/config_error.h"
#include "dscpp/data/data_error.h"
#include "dscpp/data/data_loader.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/rng_tracker.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/monitor/monitor.h"
#include "moe_training.h"
#include "non_finite_check.h"
#include "train_gpt_checkpoint.h"
#include "train_gpt_log.h"

namespace dscpp::examples {

namespace {

// What a pipeline run of train_gpt does not do yet: each refused with its flag named.
void refuse_unsupported(const GptOptions& args) {
  auto refuse = [](const std::string& flag, const std::string& why) {
    throw FlagError(fmt::format("{} with a pipeline: {}", flag, why));
  };
  if (args.profile_step > 0) refuse("--profile-step", "not supported on a pipeline yet");
  if (!args.memory_snapshot.empty()) refuse("--memory-snapshot", "not supported on a pipeline yet");
  if (args.bench_no_comm)
    refuse("--bench-no-comm", "the stages' activations must travel (no no-op group for them)");
}

}  // namespace

JobLayout job_layout(const model_zoo::GPTConfig& cfg, const nlohmann::json& ds_config,
                     const GptOptions& args, int64_t world) {
  const auto& par = cfg.parallelism;
  JobLayout layout;
  // The tensor-parallel degree: the model config's or the flag's (the same when both given).
  layout.tensor = par.tensor_model_parallel_size;
  if (args.tensor_model_parallel_size > 1) {
    if (layout.tensor > 1 && layout.tensor != args.tensor_model_parallel_size)
      throw FlagError(fmt::format(
          "tensor-parallel degree: the model config's parallelism.tensor_model_parallel_size is "
          "{} but --tensor-model-parallel-size is {}; give one, or the same",
          layout.tensor, args.tensor_model_parallel_size));
    layout.tensor = args.tensor_model_parallel_size;
  }
  // Each source that names a degree, with how to say where it came from.
  std::vector<std::pair<int64_t, std::string>> given;
  if (par.pipeline_model_parallel_size > 1)
    given.emplace_back(par.pipeline_model_parallel_size,
                       "the model config's parallelism.pipeline_model_parallel_size");
  // A number in the ds_config counts as given whatever it is (stages: 1 against a flag of 2
  // is a contradiction); "auto" does not.
  const auto pipe = ds_config.find("pipeline");
  if (pipe != ds_config.end() && pipe->is_object()) {
    const auto stages = pipe->find("stages");
    if (stages != pipe->end() && stages->is_number_integer()) {
      if (stages->get<int64_t>() < 1)
        throw ConfigError(
            "pipeline.stages",
            fmt::format("expected a number of stages >= 1 or \"auto\", found {}", stages->dump()));
      given.emplace_back(stages->get<int64_t>(), "the ds_config's pipeline.stages");
    }
  }
  if (args.pipeline_model_parallel_size > 1)
    given.emplace_back(args.pipeline_model_parallel_size, "--pipeline-model-parallel-size");
  if (!given.empty()) {
    layout.pipeline = given.front().first;
    layout.source = given.front().second;
  }
  for (const auto& [degree, where] : given)
    if (degree != layout.pipeline)
      throw FlagError(fmt::format("pipeline degree: {} is {} but {} is {}; give one, or the same",
                                  given.front().second, layout.pipeline, where, degree));
  // The sequence-parallel degree: the model config's or the ds_config's sequence_parallel_size
  // (DeepSpeed's key; the same when both given).
  layout.sequence = par.sequence_parallel_size;
  const auto sp = ds_config.find("sequence_parallel_size");
  if (sp != ds_config.end() && sp->is_number_integer() && sp->get<int64_t>() > 1) {
    if (layout.sequence > 1 && layout.sequence != sp->get<int64_t>())
      throw FlagError(fmt::format(
          "sequence-parallel degree: the model config's parallelism.sequence_parallel_size is "
          "{} but the ds_config's sequence_parallel_size is {}; give one, or the same",
          layout.sequence, sp->get<int64_t>()));
    layout.sequence = sp->get<int64_t>();
  }
  model_zoo::ParallelismConfig p = par;
  p.pipeline_model_parallel_size = layout.pipeline;
  p.tensor_model_parallel_size = layout.tensor;
  p.sequence_parallel_size = layout.sequence;
  layout.data = p.resolve(world).data_parallel_size;
  return layout;
}

std::vector<nn::LayerSpec> seeded_layer_specs(std::vector<nn::LayerSpec> specs, int64_t base_seed) {
  for (size_t i = 0; i < specs.size(); ++i) {
    auto build = std::move(specs[i].build);
    const auto seed = static_cast<uint64_t>(base_seed + static_cast<int64_t>(i));
    specs[i].build = [build, seed] {
      at::manual_seed(seed);
      return build();
    };
  }
  return specs;
}

namespace {

// DeepSpeed-Ulysses in a pipeline: the sequence ranks are consecutive inside the pipeline's data
// axis (data x sequence, as train_gpt lays them out without a pipeline), so the engine partitions
// and reduces over both; each stage's group of sp ranks (stage, d·sp + q) splits the sequences.
// Every rank makes every group, in one order. Null when sp is 1.
nn::GroupPtr pipeline_sequence_group(const pipe::ParallelGroups& g, int sp) {
  nn::GroupPtr mine;
  if (sp <= 1) return mine;
  for (int s = 0; s < g.stages; ++s)
    for (int d = 0; d < g.data_size / sp; ++d)
      for (int m = 0; m < g.model_size; ++m) {
        std::vector<int> ranks;
        for (int q = 0; q < sp; ++q) ranks.push_back(g.rank_of(s, d * sp + q, m));
        if (auto sub = g.world->new_subgroup(ranks, "sequence")) mine = sub;
      }
  return mine;
}

// The schedule from what gives one (not "auto"): the flag, the model config, the ds_config's
// pipeline.schedule; more than one must agree. Written into the ds_config the engine reads.
nlohmann::json with_schedule(const GptOptions& args, const model_zoo::GPTConfig& cfg,
                             nlohmann::json ds_config) {
  std::vector<std::pair<std::string, std::string>> given;
  if (args.pipeline_schedule && *args.pipeline_schedule != "auto")
    given.emplace_back(*args.pipeline_schedule, "--pipeline-schedule");
  if (cfg.parallelism.pipeline_parallel_schedule != "auto")
    given.emplace_back(cfg.parallelism.pipeline_parallel_schedule,
                       "the model config's parallelism.pipeline_parallel_schedule");
  const auto pipe = ds_config.find("pipeline");
  if (pipe != ds_config.end() && pipe->is_object() && pipe->contains("schedule") &&
      (*pipe)["schedule"].is_string() && (*pipe)["schedule"] != "auto")
    given.emplace_back((*pipe)["schedule"].get<std::string>(), "the ds_config's pipeline.schedule");
  if (given.empty()) return ds_config;
  for (const auto& [value, source] : given)
    if (value != given.front().first)
      throw FlagError(fmt::format("pipeline schedule: {} is {} but {} is {}; give one, or the same",
                                  given.front().second, given.front().first, source, value));
  if (pipe == ds_config.end() || !pipe->is_object())
    ds_config["pipeline"] = nlohmann::json::object();
  ds_config["pipeline"]["schedule"] = given.front().first;
  return ds_config;
}

}  // namespace

int train_gpt_pipeline(const GptOptions& args, const model_zoo::GPTConfig& cfg,
                       const nlohmann::json& given_ds_config, const JobLayout& layout) {
  refuse_unsupported(args);
  const nlohmann::json ds_config = with_schedule(args, cfg, given_ds_config);
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const bool fused = cfg.cross_entropy_loss_fusion;
  pipe::PipelineOptions options(static_cast<int>(layout.pipeline));
  // ZB-V runs two chunks per stage placed in a V.
  const auto schedule = ds_config.find("pipeline");
  if (schedule != ds_config.end() && schedule->is_object() &&
      schedule->value("schedule", "") == "zb-v")
    options.num_chunks(2).v_shape(true);
  options
      .loss_fn(pipe::loss_of([fused](const at::Tensor& logits, const at::Tensor& labels) {
        return model_zoo::gpt_loss(logits, labels, fused);
      }))
      .seed_layers(true)
      .base_seed(args.seed);
  // The ds_config's partition, when it names one of PipelineModule's methods (DeepSpeed's
  // engine leaves it to the module's argument; "best", its config default, is not one).
  const auto pipe_section = ds_config.find("pipeline");
  if (pipe_section != ds_config.end() && pipe_section->is_object() &&
      pipe_section->contains("partition") && (*pipe_section)["partition"].is_string() &&
      (*pipe_section)["partition"] != "best")
    options.partition_method((*pipe_section)["partition"].get<std::string>());
  // t > 1: the (pipe x data x model) groups first, the tensor-parallel layers on the model
  // group, the vocabulary-parallel cross entropy as the loss; an MoE model's expert-parallel
  // groups split each stage and tensor rank's data group.
  std::vector<nn::LayerSpec> specs;
  nn::GroupPtr sequence_group;  // DeepSpeed-Ulysses' group of this rank (null: none)
  if (cfg.tiled_logits_loss_shards > 1)
    throw ConfigError("tiled_logits_loss_shards",
                      fmt::format("the tiled loss is not in a pipeline's last stage: its loss_fn "
                                  "takes the logits whole; expected 1, found {}",
                                  cfg.tiled_logits_loss_shards));
  if (layout.tensor > 1) {
    // (DeepSpeed-Ulysses: the data axis holds data x sequence ranks, as below; a sequence group
    // is a stage and tensor rank's sp ranks of one data rank)
    const auto topology = pipe::pipe_model_data_topology(
        static_cast<int>(layout.pipeline), static_cast<int>(layout.tensor),
        static_cast<int>(layout.data * layout.sequence));
    auto groups =
        pipe::make_parallel_groups(comm::init_distributed(), topology, options.num_chunks());
    sequence_group = pipeline_sequence_group(*groups, static_cast<int>(layout.sequence));
    model_zoo::GPTConfig tp_cfg = cfg;
    tp_cfg.parallelism.tensor_model_parallel_size = layout.tensor;
    specs = model_zoo::tensor_parallel_gpt_layer_specs(
        tp_cfg, groups->model, expert_parallel_group(cfg, topology), sequence_group);
    options.groups(groups).loss_fn(
        pipe::loss_of([group = groups->model, sequence_group](const at::Tensor& logits,
                                                              const at::Tensor& labels) {
          return model_zoo::sequence_parallel_loss(
              model_zoo::tensor_parallel_gpt_loss(logits, labels, group), labels, sequence_group);
        }));
  } else {
    // An MoE model at expert degree > 1: its expert-parallel groups split each stage's data
    // group (the pipe x data topology; the engine reduces the experts over the expert-data
    // group). DeepSpeed-Ulysses: the data axis holds data x sequence ranks; each sequence rank's
    // loss is its share of its sequences' mean (the engine sums the shares' gradients and
    // averages over the data ranks, the ds_config's sequence_parallel_size).
    const auto topology = pipe::pipe_model_data_topology(
        static_cast<int>(layout.pipeline), 1, static_cast<int>(layout.data * layout.sequence));
    if (layout.sequence > 1) {
      auto groups =
          pipe::make_parallel_groups(comm::init_distributed(), topology, options.num_chunks());
      sequence_group = pipeline_sequence_group(*groups, static_cast<int>(layout.sequence));
      options.groups(groups).loss_fn(pipe::loss_of(
          [fused, sequence_group](const at::Tensor& logits, const at::Tensor& labels) {
            return model_zoo::sequence_parallel_loss(model_zoo::gpt_loss(logits, labels, fused),
                                                     labels, sequence_group);
          }));
    }
    specs = model_zoo::gpt_layer_specs(cfg, expert_parallel_group(cfg, topology), sequence_group,
                                       activation_checkpointing::options_from_config(
                                           read_activation_checkpointing_section(ds_config)));
  }
  pipe::PipelineModule module(std::move(specs), options);
  const double built_s = seconds(start);
  const auto init_start = std::chrono::steady_clock::now();
  auto engine = dscpp::initialize(module, ds_config);
  if (!cfg.fp8.empty())
    dscpp::nn::check_fp8_usable(engine.device(), engine.core().config().fp16.enabled);
  const double init_s = seconds(init_start);
  auto& world = *engine.module().world();
  const int rank = world.rank();
  const auto device = engine.device();
  // An MoE model's aux losses and load balance, summed over every stage's layers for the log
  // (each layer's routing is the same on its t tensor ranks: counted once); its expert biases
  // move after each batch, each stage its own (moe_training.h).
  MoETraining moe(cfg, *engine.module().stage_module(), engine.module().data_group(), device,
                  engine.module().world(), layout.tensor);
  // Dropout in the split attention heads draws under the tracker's fork (differing across
  // model ranks), the replicated regions' from the default generator (agreeing).
  if (layout.tensor > 1)
    nn::model_parallel_cuda_manual_seed(static_cast<uint64_t>(args.seed),
                                        engine.module().model_parallel_id(), device);

  // --load: weights, optimizer, schedule and counters from the checkpoint's latest tag
  // (DeepSpeed's pipeline layout, or one the engine re-lays onto this layout); the data
  // position follows from the step, as in train_gpt's other loop.
  int64_t first = 0;
  if (!args.load.empty()) {
    auto r = engine.load_checkpoint(args.load);  // warns (rank 0) when there is no `latest`
    first = engine.global_steps();
    if (rank == 0)
      std::cout << (r.path.empty()
                        ? fmt::format("[train_gpt] no checkpoint in {}: starting from scratch\n",
                                      args.load)
                        : fmt::format("[train_gpt] resumed from {} at step {}\n", r.path, first))
                << std::flush;
  }
  if (first >= args.train_iters) {
    if (rank == 0) std::cout << finished_line(first, args.train_iters, ds_config) << std::flush;
    return 0;
  }

  // The first and the last stage read the same micro-batches: the data index's share of the
  // global batch, as a data-parallel rank of train_gpt reads it.
  const bool reads = engine.is_first_stage() || engine.is_last_stage();
  auto indexed = std::make_shared<data::IndexedDataset>(args.data_path);
  auto dataset = std::make_shared<data::GPTDataset>(
      indexed, data::GPTDatasetOptions{cfg.seq_length, static_cast<uint64_t>(args.seed), true,
                                       cfg.vocab_size});
  const int64_t mb = engine.train_micro_batch_size_per_gpu(),
                ga = engine.gradient_accumulation_steps();
  data::DataLoaderOptions lo;
  lo.micro_batch_size = mb;
  // (the sequence ranks of a data rank read its batches, each keeping its slice)
  lo.rank = engine.module().data_parallel_id() / static_cast<int>(layout.sequence);
  lo.world_size = engine.module().data_parallel_size() / static_cast<int>(layout.sequence);
  lo.num_epochs = 0;
  lo.start_batch = first * ga;  // resume where the checkpoint's data left off
  lo.prefetch = reads ? 2 : 0;
  data::DataLoader loader(dataset, lo);
  if (loader.batches_per_epoch() == 0)
    throw data::DataError(args.data_path,
                          fmt::format("{} tokens make no batch of {} x {} tokens per rank",
                                      indexed->num_tokens(), mb, cfg.seq_length + 1));
  pipe::DataIter data_iter;
  if (reads)
    data_iter = [&loader, device, sequence_group] {
      auto batch = loader.next();
      return pipe::MicroBatch{{model_zoo::sequence_slice(batch->input, sequence_group).to(device)},
                              model_zoo::sequence_slice(batch->target, sequence_group).to(device)};
    };

  const double flops_per_token = cfg.flops_per_token(cfg.seq_length);
  const double peak = args.peak_tflops > 0 ? args.peak_tflops : device.is_cuda() ? 989.0 : 0.0;
  const int64_t tokens_per_step = engine.train_batch_size() * cfg.seq_length;
  const int ranks = world.size();
  if (rank == 0)
    std::cout
        << fmt::format(
               "[train_gpt] GPT {:.2f}M parameters{} (L={} h={} heads={} seq={} vocab={}); "
               "{} ranks on {}, pipeline {} stages ({}) x data {} x tensor {}{}{}, ZeRO stage "
               "{}, {}; global batch {} = {} x {} x {}; data {} tokens, {} batches per rank "
               "per epoch\n",
               cfg.num_parameters() / 1e6, moe_parameter_fields(cfg), cfg.num_layers,
               cfg.hidden_size, cfg.num_attention_heads, cfg.seq_length, cfg.vocab_size, ranks,
               device.str(), layout.pipeline, layout.source, layout.data, layout.tensor,
               cfg.parallelism.expert_model_parallel_size > 1
                   ? fmt::format(" (experts {} of the data ranks)",
                                 cfg.parallelism.expert_model_parallel_size)
                   : std::string(),
               layout.sequence > 1
                   ? fmt::format(" x DeepSpeed-Ulysses sequence {}", layout.sequence)
                   : std::string(),
               engine.core().zero_optimization_stage(), at::toString(engine.core().dtype()),
               engine.train_batch_size(), mb, ga, layout.data, indexed->num_tokens(),
               loader.batches_per_epoch())
        << fmt::format(
               "[train_gpt] start-up: model built in {:.1f} s, engine initialised in "
               "{:.1f} s; {}\n",
               built_s, init_s, peak_memory(device))
        << std::flush;

  // Collective over every stage (each writes its layers' files); out of the interval's timing.
  auto save = [&](int64_t step) {
    const bool saved = save_checkpoint_or(
        [&] {
          engine.save_checkpoint(args.save, "",
                                 train_gpt_client_state(step, engine.train_batch_size()));
        },
        args.on_save_error, step, rank);
    if (saved && rank == 0)
      std::cout << fmt::format("[train_gpt] saved {}/global_step{}\n", args.save, step)
                << std::flush;
  };

  double interval_loss = 0;
  int64_t interval_steps = 0;
  auto t0 = std::chrono::steady_clock::now();
  // A non-finite loss or gradient norm (non_finite_check.h), over every stage: every rank stops,
  // or none.
  NonFiniteCheck non_finite(device);
  bool non_finite_reported = false;
  auto check_non_finite = [&] {
    const auto found = non_finite.take(world);
    if (!found.any() || non_finite_reported) return;
    if (args.check_for_nan_in_loss_and_grad)
      throw NonFiniteError(found.describe() +
                           "; stopped by --check-for-nan-in-loss-and-grad (the default; "
                           "--no-check-for-nan-in-loss-and-grad reports it and trains on)");
    if (rank == 0)
      std::cout << "[train_gpt] warning: " << found.describe()
                << "; training goes on (--no-check-for-nan-in-loss-and-grad)\n"
                << std::flush;
    non_finite_reported = true;
  };
  // The log line of the interval that ends with step `done` (collective: every rank calls it).
  auto log_interval = [&](int64_t done) {
    // The bubble of this step and the interval's seconds: the means over every rank's stage,
    // so that rank 0's line and the monitors' writer (the last stage's) show the same figures.
    at::Tensor figures =
        at::tensor({engine.last_bubble_fraction(), seconds(t0)}, at::kDouble).to(device);
    world.all_reduce(figures, comm::ReduceOp::kAvg).wait();
    figures = figures.cpu();
    const double bubble = figures[0].item<double>(), secs = figures[1].item<double>();
    const double tokens_per_s = static_cast<double>(interval_steps * tokens_per_step) / secs;
    const double tflops = tokens_per_s * flops_per_token / ranks / 1e12;
    const std::string moe_fields = moe.interval_report(interval_steps);  // collective
    if (rank == 0) {
      IntervalFigures f;
      f.step = done;
      f.train_iters = args.train_iters;
      f.loss = interval_loss / interval_steps;
      f.lr = engine.get_lr()[0];
      f.grad_norm = engine.get_global_grad_norm();
      f.loss_scale = engine.loss_scale();
      f.tokens_per_s = tokens_per_s;
      f.ranks = ranks;
      f.tflops_per_rank = tflops;
      f.peak_tflops = peak;
      f.moe = moe.active();
      f.moe_fields = moe_fields;
      std::cout << "[train_gpt] " << interval_fields(f, device)
                << fmt::format(" | bubble {:.3f}\n", bubble) << std::flush;
    }
    // What only the program knows, beside the engine's own events, as train_gpt's other loop
    // writes them (docs/monitor.md); the engine's reporting rank (the last stage's) writes.
    if (engine.core().monitor_enabled()) {
      const auto x = engine.core().global_samples();
      std::vector<monitor::Event> events = {{"Train/Samples/tokens_per_sec", tokens_per_s, x},
                                            {"Train/Samples/tflops_per_rank", tflops, x},
                                            {"Train/Samples/pipeline_bubble", bubble, x}};
      if (peak > 0) events.push_back({"Train/Samples/mfu", tflops / peak, x});
      engine.core().write_monitor_events(events);
    }
    interval_loss = 0;
    interval_steps = 0;
    t0 = std::chrono::steady_clock::now();
    check_non_finite();  // after the line: it shows the interval's loss
  };
  for (int64_t step = first; step < args.train_iters; ++step) {
    const int64_t done = step + 1;
    // Every stage returns the batch's loss (the mean over micro-batches and data ranks).
    const at::Tensor loss = engine.train_batch(data_iter);
    interval_loss += loss.item<double>();
    non_finite.after_step(done, loss, engine.core().global_grad_norm_tensor(),
                          engine.core().was_step_applied());
    moe.add_aux(engine.last_aux_loss(), 1);
    moe.after_boundary();  // the expert biases, from the global batch's routing
    ++interval_steps;
    if (done % args.log_interval == 0 || done == args.train_iters) log_interval(done);
    // Every --save-interval steps (and at the end, below), kept out of the interval's timing.
    if (!args.save.empty() && args.save_interval > 0 && done % args.save_interval == 0) {
      const auto s0 = std::chrono::steady_clock::now();
      check_non_finite();  // a diverged run saves no checkpoint over a good one
      save(done);
      t0 += std::chrono::steady_clock::now() - s0;
    }
  }
  if (!args.save.empty() &&
      (args.save_interval <= 0 || args.train_iters % args.save_interval != 0) &&
      engine.global_steps() > first) {
    check_non_finite();
    save(engine.global_steps());
  }
  if (rank == 0) {
    const auto& ds = engine.core().config();
    std::cout << "[train_gpt] done. Logs: the lines above";
    if (ds.tensorboard.enabled)
      std::cout << "; TensorBoard: "
                << std::filesystem::absolute(monitor::monitor_log_dir(ds.tensorboard)).string();
    if (ds.csv_monitor.enabled)
      std::cout << "; CSV: "
                << std::filesystem::absolute(monitor::monitor_log_dir(ds.csv_monitor)).string();
    if (!args.save.empty())
      std::cout << "; checkpoint: " << std::filesystem::absolute(args.save).string();
    std::cout << "\n" << std::flush;
  }
  return 0;
}

}  // namespace dscpp::examples
