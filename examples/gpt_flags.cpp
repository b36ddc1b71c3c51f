// parse_gpt_flags and apply_gpt_flags: train_gpt's one command-line reader.
#include "gpt_flags.h"

#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

namespace dscpp::examples {

namespace po = boost::program_options;
using nlohmann::json;

namespace {

// Two spellings of one flag (--data-path / --train-data-path): either, or both alike.
std::string one_of(const po::variables_map& vm, const char* a, const char* b, bool required) {
  const bool has_a = vm.count(a) > 0, has_b = vm.count(b) > 0;
  if (has_a && has_b && vm[a].as<std::string>() != vm[b].as<std::string>())
    throw FlagError(fmt::format("--{} '{}' and --{} '{}' are one flag given two values", a,
                                vm[a].as<std::string>(), b, vm[b].as<std::string>()));
  if (has_a) return vm[a].as<std::string>();
  if (has_b) return vm[b].as<std::string>();
  if (required) throw FlagError(fmt::format("--{} (or --{}) is required", a, b));
  return "";
}

template <typename T>
void positive(const std::optional<T>& v, const char* flag) {
  if (v && *v <= 0) throw FlagError(fmt::format("--{}: expected a value > 0, found {}", flag, *v));
}

}  // namespace

GptOptions parse_gpt_flags(int argc, const char* const* argv) {
  GptOptions a;
  std::string data_path, train_data_path;
  int64_t micro = 0, global = 0, warmup = 0, decay_iters = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, clip = 0;
  std::string style, pipeline_schedule;
  bool nan_check = false, no_nan_check = false;
  po::options_description o("train_gpt options (Megatron-LM's and DeepSpeed's names)");
  // clang-format off
  o.add_options()
    ("help,h", "this text")
    ("model-config", po::value<std::string>(&a.model_config), "GPT config (JSON)")
    ("data-path", po::value<std::string>(), "indexed dataset prefix (PREFIX.bin / PREFIX.idx, "
     "from tools/preprocess_data); Megatron-LM's name")
    ("train-data-path", po::value<std::string>(), "the same as --data-path")
    ("deepspeed_config", po::value<std::string>(), "ds_config JSON (DeepSpeed's name)")
    ("deepspeed-config", po::value<std::string>(), "the same as --deepspeed_config")
    ("deepspeed", po::bool_switch(&a.deepspeed),
     "Megatron-DeepSpeed's switch; accepted, the engine is always dscpp's")
    ("micro-batch-size", po::value(&micro), "fills train_micro_batch_size_per_gpu")
    ("global-batch-size", po::value(&global), "fills train_batch_size")
    ("lr", po::value(&lr), "fills optimizer.params.lr (and scheduler.params.warmup_max_lr)")
    ("min-lr", po::value(&min_lr), "the schedule's floor: scheduler.params.warmup_min_lr "
     "(WarmupLR, WarmupDecayLR) or cos_min_ratio = min-lr / lr (WarmupCosineLR)")
    ("lr-warmup-iters", po::value(&warmup), "fills scheduler.params.warmup_num_steps")
    ("lr-decay-iters", po::value(&decay_iters), "fills scheduler.params.total_num_steps")
    ("lr-decay-style", po::value(&style), "constant, linear or cosine: scheduler.type WarmupLR, "
     "WarmupDecayLR or WarmupCosineLR")
    ("weight-decay", po::value(&weight_decay), "fills optimizer.params.weight_decay")
    ("adam-beta1", po::value(&beta1), "fills optimizer.params.betas[0] (the other: 0.999)")
    ("adam-beta2", po::value(&beta2), "fills optimizer.params.betas[1] (the other: 0.9)")
    ("adam-eps", po::value(&eps), "fills optimizer.params.eps")
    ("clip-grad", po::value(&clip), "fills gradient_clipping")
    ("fp16", po::bool_switch(&a.fp16), "fp16.enabled")
    ("bf16", po::bool_switch(&a.bf16), "bf16.enabled")
    ("train-iters", po::value(&a.train_iters), "optimizer steps in all (default 100); fills an "
     "\"auto\" scheduler.params.total_num_steps")
    ("save", po::value(&a.save), "checkpoint folder to save to")
    ("save-interval", po::value(&a.save_interval)->default_value(0),
     "save every K steps (0: only at the end, when --save is given)")
    ("on-save-error", po::value(&a.on_save_error)->default_value(a.on_save_error),
     "what a checkpoint that cannot be written (a full disk, a file-size limit) does: stop "
     "(the run ends, exit status 1) or continue (rank 0 warns and training goes on)")
    ("load", po::value(&a.load), "checkpoint folder to resume from (if it holds one)")
    ("log-interval", po::value(&a.log_interval)->default_value(10), "log every K steps")
    ("seed", po::value(&a.seed)->default_value(1234), "initialisation and data order")
    ("tensor-model-parallel-size", po::value(&a.tensor_model_parallel_size)->default_value(1),
     "tensor-parallel degree")
    ("pipeline-model-parallel-size", po::value(&a.pipeline_model_parallel_size)->default_value(1),
     "pipeline-parallel degree")
    ("pipeline-schedule", po::value(&pipeline_schedule),
     "the pipeline's schedule: auto, 1f1b, interleaved, zb-h1 or zb-v (the ds_config's "
     "pipeline.schedule; the model config's parallelism.pipeline_parallel_schedule)")
    ("sequence-parallel", po::bool_switch(&a.sequence_parallel),
     "sequence parallelism in the tensor-parallel regions (needs a tensor degree > 1)")
    ("check-for-nan-in-loss-and-grad", po::bool_switch(&nan_check),
     "stop the run, exit status 1, at the first step whose loss or gradient norm is NaN or "
     "infinite, naming it (the default; checked at each log line and before each save, with no "
     "host wait per step; steps fp16's loss scaler skips are its own)")
    ("no-check-for-nan-in-loss-and-grad", po::bool_switch(&no_nan_check),
     "report the first non-finite step once and train on")
    ("peak-tflops", po::value(&a.peak_tflops)->default_value(0),
     "a rank's peak TFLOP/s for MFU (0: 989 on a CUDA device, the H100/H200 bf16 dense "
     "peak; none on the CPU)")
    ("profile-step", po::value(&a.profile_step)->default_value(0),
     "record optimizer step N (1-based) with the Kineto profiler (0: off)")
    ("profile-steps", po::value(&a.profile_steps)->default_value(1),
     "record this many consecutive steps from --profile-step into the one trace")
    ("memory-snapshot", po::value(&a.memory_snapshot),
     "CUDA: write the caching allocator's history of one step (a memory_viz pickle) here")
    ("memory-snapshot-step", po::value(&a.memory_snapshot_step)->default_value(2),
     "the step --memory-snapshot records (1-based)")
    ("profile-out", po::value(&a.profile_out)->default_value(a.profile_out),
     "Chrome trace JSON written by --profile-step")
    ("profile-all-ranks", po::bool_switch(&a.profile_all_ranks),
     "every rank writes its trace (PATH with -rank<R> before the extension), not only rank 0")
    ("layer-specs", po::bool_switch(&a.layer_specs),
     "build the GPT as its LayerSpecs (nn::LayerModule) at every ZeRO stage; at stage 3 "
     "it always is, so that parameters are gathered layer by layer")
    ("bench-no-comm", po::bool_switch(&a.bench_no_comm),
     "a benchmark's bound: the engine gets a no-op process group, so ZeRO's collectives move "
     "no data (the model does not train correctly; only the step time means something)")
    ("grouped-wgrad", po::value(&a.grouped_wgrad)->default_value(a.grouped_wgrad),
     "the experts' weight gradient: auto (a GEMM per expert into ZeRO's buffer where that "
     "pays), loop (always that), grouped (cuBLAS's grouped GEMM into the buffer) or off "
     "(returned to autograd); a benchmarking switch")
    ("seed-layers", po::bool_switch(&a.seed_layers),
     "build the GPT as its LayerSpecs, each layer seeded with --seed + its index (DeepSpeed's "
     "seed_layers): the initial weights of a pipeline run, on any number of stages")
    ("dry-run", po::bool_switch(&a.dry_run),
     "print the parameter count, model states per GPU at ZeRO 0-3, activation memory per "
     "micro-batch and the rank layout of --model-config, then exit: nothing is allocated, no "
     "process group made (--train-data-path and --deepspeed_config optional)")
    ("local_rank", po::value<int>(), "set by the launcher");
  // clang-format on
  po::options_description hidden;
  hidden.add_options()("dscpp-positional", po::value<std::vector<std::string>>());
  po::options_description all;
  all.add(o).add(hidden);
  po::positional_options_description positional;
  positional.add("dscpp-positional", -1);
  po::variables_map vm;
  try {
    // Boost's default style guesses an unambiguous prefix (`--train-it` for --train-iters,
    // `--deepspeed` for --deepspeed_config): off, as the launcher and argparse's
    // allow_abbrev=False have it.
    const int style_bits =
        po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::command_line_parser(argc, argv)
                  .options(all)
                  .positional(positional)
                  .style(style_bits)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw FlagError(std::string(e.what()) + " (train_gpt --help lists the flags)");
  }
  if (vm.count("dscpp-positional")) {
    const auto& extra = vm["dscpp-positional"].as<std::vector<std::string>>();
    throw FlagError(fmt::format(
        "unexpected argument '{}': every value follows its flag (--deepspeed takes none; the "
        "config is --deepspeed_config FILE)",
        extra.front()));
  }
  if (vm.count("help")) {
    std::ostringstream text;
    text << o;
    a.help = true;
    a.help_text = text.str();
    return a;
  }
  a.data_path = one_of(vm, "data-path", "train-data-path", !a.dry_run);
  a.ds_config = one_of(vm, "deepspeed_config", "deepspeed-config", !a.dry_run);
  if (a.model_config.empty()) throw FlagError("--model-config is required");
  a.train_iters_given = vm.count("train-iters") > 0;
  if (nan_check && no_nan_check)
    throw FlagError(
        "--check-for-nan-in-loss-and-grad and --no-check-for-nan-in-loss-and-grad: choose one");
  a.check_for_nan_in_loss_and_grad = !no_nan_check;
  if (vm.count("micro-batch-size")) a.micro_batch_size = micro;
  if (vm.count("global-batch-size")) a.global_batch_size = global;
  if (vm.count("lr")) a.lr = lr;
  if (vm.count("min-lr")) a.min_lr = min_lr;
  if (vm.count("lr-warmup-iters")) a.lr_warmup_iters = warmup;
  if (vm.count("weight-decay")) a.weight_decay = weight_decay;
  if (vm.count("adam-beta1")) a.adam_beta1 = beta1;
  if (vm.count("adam-beta2")) a.adam_beta2 = beta2;
  if (vm.count("adam-eps")) a.adam_eps = eps;
  if (vm.count("clip-grad")) a.clip_grad = clip;
  if (vm.count("lr-decay-iters")) a.lr_decay_iters = decay_iters;
  if (vm.count("pipeline-schedule")) {
    if (pipeline_schedule != "auto" && pipeline_schedule != "1f1b" &&
        pipeline_schedule != "interleaved" && pipeline_schedule != "zb-h1" &&
        pipeline_schedule != "zb-v")
      throw FlagError(
          "--pipeline-schedule: expected auto, 1f1b, interleaved, zb-h1 or zb-v, found '" +
          pipeline_schedule + "'");
    a.pipeline_schedule = pipeline_schedule;
  }
  if (vm.count("lr-decay-style")) {
    if (style != "constant" && style != "linear" && style != "cosine")
      throw FlagError("--lr-decay-style: expected constant, linear or cosine, found '" + style +
                      "'");
    a.lr_decay_style = style;
  }
  positive(a.micro_batch_size, "micro-batch-size");
  positive(a.global_batch_size, "global-batch-size");
  positive(a.lr, "lr");
  positive(a.lr_decay_iters, "lr-decay-iters");
  if (a.min_lr && *a.min_lr < 0)
    throw FlagError(fmt::format("--min-lr: expected a value >= 0, found {}", *a.min_lr));
  if (a.lr_warmup_iters && *a.lr_warmup_iters < 0)
    throw FlagError(
        fmt::format("--lr-warmup-iters: expected a count >= 0, found {}", *a.lr_warmup_iters));
  if (a.train_iters < 1)
    throw FlagError(fmt::format("--train-iters: expected a count >= 1, found {}", a.train_iters));
  if (a.log_interval < 1)
    throw FlagError(fmt::format("--log-interval: expected a count >= 1, found {}", a.log_interval));
  if (a.save_interval < 0)
    throw FlagError(
        fmt::format("--save-interval: expected a count >= 0, found {}", a.save_interval));
  if (a.on_save_error != "stop" && a.on_save_error != "continue")
    throw FlagError(
        fmt::format("--on-save-error: expected stop or continue, found '{}'", a.on_save_error));
  if (a.tensor_model_parallel_size < 1 || a.pipeline_model_parallel_size < 1)
    throw FlagError(
        "--tensor-model-parallel-size and --pipeline-model-parallel-size: expected "
        "degrees >= 1");
  if (a.fp16 && a.bf16) throw FlagError("--fp16 and --bf16: choose one");
  if (a.profile_steps < 1)
    throw FlagError(
        fmt::format("--profile-steps: expected a count >= 1, found {}", a.profile_steps));
  return a;
}

namespace {

// The ds_config with the flags' values going in, and the contradictions found on the way.
class Filler {
 public:
  explicit Filler(json& root) : root_(root) {}

  // The node at a dotted path; nullptr where a section on the way is missing.
  json* find(const std::string& path, bool create = false) {
    json* node = &root_;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      if (!node->is_object()) return nullptr;
      if (!node->contains(part)) {
        if (!create) return nullptr;
        (*node)[part] = dot == std::string::npos ? json() : json::object();
      }
      node = &(*node)[part];
      if (dot == std::string::npos) return node;
      start = dot + 1;
    }
  }

  static bool is_auto(const json* v) { return v && v->is_string() && *v == "auto"; }

  // Hugging Face's fill_match: "auto" takes the flag's value; a value written there must
  // equal it (numbers compared as numbers). A missing key is added where its section exists
  // and `add` says the section takes it (Hugging Face leaves it to DeepSpeed's default, which
  // need not be the flag's value); otherwise left alone.
  void match(const std::string& path, const json& value, const std::string& flag, bool add = true) {
    json* node = find(path);
    if (!node) {
      const size_t dot = path.rfind('.');
      json* parent = dot == std::string::npos ? &root_ : find(path.substr(0, dot));
      if (add && parent && parent->is_object()) (*parent)[path.substr(dot + 1)] = value;
      return;
    }
    if (is_auto(node)) {
      *node = value;
      return;
    }
    if (!same(*node, value))
      mismatches_.push_back(
          fmt::format("- ds_config {}={} vs {}={}", path, node->dump(), flag, value.dump()));
  }

  // Hugging Face's fill_only: an "auto" takes the value, anything else stays.
  void fill(const std::string& path, const json& value) {
    json* node = find(path);
    if (is_auto(node)) *node = value;
  }

  const std::vector<std::string>& mismatches() const { return mismatches_; }

 private:
  static bool same(const json& a, const json& b) {
    if (a.is_array() && b.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i])) return false;
      return true;
    }
    if (a.is_number() && b.is_number()) {
      const double x = a.get<double>(), y = b.get<double>();
      return std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y));
    }
    return a == b;
  }

  json& root_;
  std::vector<std::string> mismatches_;
};

const char* schedule_of(const std::string& style) {
  if (style == "constant") return "WarmupLR";
  if (style == "cosine") return "WarmupCosineLR";
  return "WarmupDecayLR";  // Megatron-LM's default style, linear
}

// The batch size of the three that the other two (and the world) determine, where it is
// "auto" (Hugging Face computes train_batch_size = world * micro * accumulation). Where the
// division leaves a remainder, the error shows it with the numbers and where each came from
// (a flag or the ds_config), as Megatron-LM's "global batch size is not divisible by micro
// batch size times data parallel size" does.
void resolve_batch_autos(json& ds, int64_t world, const GptOptions& a) {
  auto num = [&](const char* k) -> std::optional<int64_t> {
    if (!ds.contains(k)) return std::nullopt;
    if (ds[k].is_number_integer()) return ds[k].get<int64_t>();
    return std::nullopt;
  };
  auto is_auto = [&](const char* k) { return Filler::is_auto(ds.contains(k) ? &ds[k] : nullptr); };
  const auto tb = num("train_batch_size"), mb = num("train_micro_batch_size_per_gpu");
  auto ga = num("gradient_accumulation_steps");
  if (!ds.contains("gradient_accumulation_steps")) ga = 1;
  const std::string tb_from =
      a.global_batch_size ? "--global-batch-size" : "ds_config train_batch_size";
  const std::string mb_from =
      a.micro_batch_size ? "--micro-batch-size" : "ds_config train_micro_batch_size_per_gpu";
  // world * factor, or 0 where it leaves int64 (then it divides no batch size).
  auto times_world = [&](int64_t factor) {
    int64_t out = 0;
    return __builtin_mul_overflow(factor, world, &out) ? 0 : out;
  };
  if (is_auto("train_batch_size") && mb && ga) ds["train_batch_size"] = *mb * *ga * world;
  if (is_auto("train_micro_batch_size_per_gpu") && tb && ga) {
    const int64_t per_micro = times_world(*ga);
    if (per_micro == 0 || *tb % per_micro != 0)
      throw FlagError(fmt::format(
          "{} {} is not a multiple of {} x {} = {} (gradient_accumulation_steps x data ranks), "
          "so train_micro_batch_size_per_gpu (\"auto\" in the ds_config) has no whole value: "
          "give --micro-batch-size, or a global batch size that is a multiple of {}",
          tb_from, *tb, *ga, world, per_micro, per_micro));
    ds["train_micro_batch_size_per_gpu"] = *tb / per_micro;
  }
  if (is_auto("gradient_accumulation_steps") && tb && mb) {
    const int64_t per_step = times_world(*mb);
    if (per_step == 0 || *tb % per_step != 0)
      throw FlagError(fmt::format(
          "{} {} is not a multiple of {} x {} = {} ({} x data ranks), so "
          "gradient_accumulation_steps (\"auto\" in the ds_config) has no whole value: give a "
          "global batch size that is a multiple of {}",
          tb_from, *tb, *mb, world, per_step, mb_from, per_step));
    ds["gradient_accumulation_steps"] = *tb / per_step;
  }
}

}  // namespace

json apply_gpt_flags(json ds, const GptOptions& a, int64_t world) {
  if (!ds.is_object()) return ds;  // the engine's config reader says what is wrong with it
  Filler f(ds);
  if (a.micro_batch_size)
    f.match("train_micro_batch_size_per_gpu", *a.micro_batch_size, "--micro-batch-size");
  if (a.global_batch_size) f.match("train_batch_size", *a.global_batch_size, "--global-batch-size");
  // A flag that asks for a batch size the config does not name adds it; the config reader
  // then checks that the three agree, as DeepSpeed does.
  if (a.micro_batch_size && !ds.contains("train_micro_batch_size_per_gpu"))
    ds["train_micro_batch_size_per_gpu"] = *a.micro_batch_size;
  if (a.global_batch_size && !ds.contains("train_batch_size"))
    ds["train_batch_size"] = *a.global_batch_size;
  resolve_batch_autos(ds, world, a);

  // Mixed precision: the flag switches its section on; the other one must not be on.
  for (const auto& [on, name, other] :
       {std::tuple{a.fp16, "fp16", "bf16"}, std::tuple{a.bf16, "bf16", "fp16"}}) {
    if (!on) continue;
    if (!ds.contains(name) || !ds[name].is_object()) ds[name] = json::object();
    if (!ds[name].contains("enabled")) ds[name]["enabled"] = true;
    f.match(std::string(name) + ".enabled", true, std::string("--") + name);
    json* o = f.find(std::string(other) + ".enabled");
    if (o && o->is_boolean() && o->get<bool>())
      throw FlagError(fmt::format("--{} contradicts the ds_config's {}.enabled=true", name, other));
  }

  // The optimizer: --lr fills its lr; with no optimizer section, an AdamW with Megatron-LM's
  // defaults (weight decay 0.01, betas 0.9/0.999, eps 1e-8).
  if (a.lr) {
    if (!ds.contains("optimizer"))
      ds["optimizer"] = {
          {"type", "AdamW"},
          {"params",
           {{"lr", *a.lr}, {"weight_decay", 0.01}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}}}};
    f.match("optimizer.params.lr", *a.lr, "--lr");
  }
  // Adam's other settings and clipping; an "auto" no flag names takes Megatron-LM's default
  // (weight decay 0.01, betas 0.9 / 0.999, eps 1e-8, clip 1.0), as Hugging Face fills its own.
  json* opt_type = f.find("optimizer.type");
  std::string otype = opt_type && opt_type->is_string() ? opt_type->get<std::string>() : "";
  for (auto& ch : otype) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool adam_like =
      otype.find("adam") != std::string::npos || otype.find("lamb") != std::string::npos;
  if (a.weight_decay) f.match("optimizer.params.weight_decay", *a.weight_decay, "--weight-decay");
  if (a.adam_beta1 || a.adam_beta2)
    f.match("optimizer.params.betas",
            json::array({a.adam_beta1.value_or(0.9), a.adam_beta2.value_or(0.999)}),
            "--adam-beta1/--adam-beta2", adam_like);
  if (a.adam_eps) f.match("optimizer.params.eps", *a.adam_eps, "--adam-eps", adam_like);
  if (a.clip_grad) f.match("gradient_clipping", *a.clip_grad, "--clip-grad");
  f.fill("optimizer.params.weight_decay", 0.01);
  f.fill("optimizer.params.betas", json::array({0.9, 0.999}));
  f.fill("optimizer.params.eps", 1e-8);
  f.fill("gradient_clipping", 1.0);

  // The schedule: the flags fill the ds_config's; with none, any schedule flag makes one,
  // Megatron-LM's way (linear warmup from 0, decay to --min-lr at --lr-decay-iters, which
  // defaults to --train-iters).
  const bool schedule_flags = a.lr_decay_style || a.lr_warmup_iters || a.min_lr || a.lr_decay_iters;
  if (schedule_flags && !ds.contains("scheduler")) {
    const std::string type = schedule_of(a.lr_decay_style.value_or("linear"));
    json params = {{"warmup_num_steps", "auto"}, {"warmup_type", "linear"}};
    if (type != "WarmupLR") params["total_num_steps"] = "auto";
    if (type == "WarmupCosineLR") {
      params["warmup_min_ratio"] = 0.0;
      params["cos_min_ratio"] = "auto";
    } else {
      params["warmup_min_lr"] = "auto";
      params["warmup_max_lr"] = "auto";
    }
    ds["scheduler"] = {{"type", type}, {"params", params}};
  }
  if (a.lr_decay_style)
    f.match("scheduler.type", schedule_of(*a.lr_decay_style), "--lr-decay-style");
  json* type_node = f.find("scheduler.type");
  const std::string type = type_node && type_node->is_string() ? type_node->get<std::string>() : "";
  const bool warmup_lr = type == "WarmupLR", cosine = type == "WarmupCosineLR";
  if (a.lr) f.match("scheduler.params.warmup_max_lr", *a.lr, "--lr", !cosine && !type.empty());
  if (a.lr_warmup_iters)
    f.match("scheduler.params.warmup_num_steps", *a.lr_warmup_iters, "--lr-warmup-iters",
            !type.empty());
  if (a.lr_decay_iters)
    f.match("scheduler.params.total_num_steps", *a.lr_decay_iters, "--lr-decay-iters",
            !type.empty() && !warmup_lr);
  // --train-iters is how long this run goes, not the schedule's length: a run resumed past
  // its schedule, or stopped before its end, is not a contradiction; it fills an "auto" only.
  f.fill("scheduler.params.total_num_steps", a.train_iters);
  if (a.min_lr) {
    if (type == "WarmupCosineLR") {
      // The floor as a ratio of the optimizer's lr (the flag's, or a number in the config).
      json* lr = f.find("optimizer.params.lr");
      const std::optional<double> base =
          a.lr ? a.lr
               : (lr && lr->is_number() ? std::optional<double>(lr->get<double>()) : std::nullopt);
      if (!base)
        throw FlagError(
            "--min-lr with WarmupCosineLR needs the lr (--lr, or a number in the "
            "ds_config's optimizer.params.lr) to make cos_min_ratio");
      f.match("scheduler.params.cos_min_ratio", *a.min_lr / *base,
              fmt::format("--min-lr/--lr={}/{}", *a.min_lr, *base));
    } else {
      f.match("scheduler.params.warmup_min_lr", *a.min_lr, "--min-lr", !type.empty());
    }
  }
  // Megatron-LM's warmup starts at 0; an unfilled floor is 0, an unfilled warmup none.
  f.fill("scheduler.params.warmup_min_lr", 0.0);
  f.fill("scheduler.params.warmup_num_steps", 0);
  f.fill("scheduler.params.cos_min_ratio", 0.0);
  if (json* lr = f.find("optimizer.params.lr"); lr && lr->is_number())
    f.fill("scheduler.params.warmup_max_lr", *lr);

  if (!f.mismatches().empty()) {
    std::string list;
    for (const auto& m : f.mismatches()) list += "\n" + m;
    throw FlagError("the ds_config contradicts the command line:" + list +
                    "\nset these ds_config values to \"auto\", or drop the flags");
  }

  // What the engine needs resolved and only a flag could have given.
  const std::vector<std::pair<const char*, const char*>> needs = {
      {"train_batch_size", "--global-batch-size"},
      {"train_micro_batch_size_per_gpu", "--micro-batch-size"},
      {"gradient_accumulation_steps",
       // Only the flags of the two sizes it is derived from that are still missing.
       Filler::is_auto(f.find("train_batch_size"))
           ? (Filler::is_auto(f.find("train_micro_batch_size_per_gpu"))
                  ? "--global-batch-size and --micro-batch-size"
                  : "--global-batch-size")
           : "--micro-batch-size"},
      {"optimizer.params.lr", "--lr"},
      {"scheduler.type", "--lr-decay-style"},
      {"scheduler.params.warmup_max_lr", "--lr"},
      {"scheduler.params.warmup_num_steps", "--lr-warmup-iters"},
      {"scheduler.params.total_num_steps", "--lr-decay-iters or --train-iters"}};
  std::string unfilled;
  for (const auto& [path, flag] : needs)
    if (Filler::is_auto(f.find(path)))
      unfilled += fmt::format("\n- ds_config {} is \"auto\": give {}", path, flag);
  if (!unfilled.empty())
    throw FlagError("the ds_config leaves values to the command line that it does not give:" +
                    unfilled + "\n(or write numbers in the ds_config)");
  return ds;
}

void require_optimizer(const json& ds) {
  if (!ds.is_object()) return;  // the engine's config reader says what is wrong with it
  const auto o = ds.find("optimizer");
  // DeepSpeed builds no optimizer from a section without a type either.
  if (o != ds.end() && !(o->is_object() && !o->contains("type"))) return;
  throw FlagError(
      "the ds_config names no optimizer: give --lr (an AdamW with Megatron-LM's defaults, "
      "weight decay 0.01, betas 0.9/0.999, eps 1e-8; --weight-decay, --adam-beta1, --adam-beta2 "
      "and --adam-eps change them), or write an \"optimizer\" section with a \"type\" in the "
      "ds_config");
}

}  // namespace dscpp::examples
