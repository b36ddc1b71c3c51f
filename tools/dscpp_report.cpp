// dscpp_report: DeepSpeed's ds_report for dscpp. Alone it prints, in ds_report's layout, the op
// report (every op and kernel this build holds: compiled in, and usable on this machine) and
// the general environment (versions of dscpp, LibTorch, CUDA, NCCL and the compiler, install
// and library paths, build type, devices, /dev/shm). --json prints the same as one JSON
// object. With --config it prints the resolved ds_config (every key, effective value) as JSON,
// with warnings and ignored features on stderr. Exit codes: 0 fine, 2 bad config or usage.
// --config-list FILE resolves many configs in one process (a test's whole set without a
// launch each): FILE holds one JSON request a line, {"config": PATH_OR_TEXT, "world_size": N,
// "autos": {KEY: VALUE}, "strict": BOOL}; each prints one JSON line {"exit": 0|2, "stdout":
// what --config prints, "stderr": its warnings or error}, by the code --config runs (exit 1:
// an exception that is not a dscpp::Error, where --config alone would abort).
// The optimizer and scheduler params are checked by the code the engine builds them with
// (optim/), so a config this accepts is one dscpp::initialize accepts.
#include <fmt/format.h>
#include <link.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dscpp/comm/error_text.h"
#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/build_info.h"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

#ifndef DSCPP_BUILD_TYPE
#define DSCPP_BUILD_TYPE "unknown"
#endif

#ifdef DSCPP_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("g++ ") + __VERSION__;
#else
  return "unknown";
#endif
}

// Where LibTorch was loaded from: the loaded object named libtorch_cpu.so (libtorch.so in
// older wheels). A symbol's address would not do: in the executable it is its PLT entry.
std::string libtorch_library() {
  std::string found;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::string*>(data);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const std::string base = std::filesystem::path(name).filename().string();
        if (base.rfind("libtorch_cpu.so", 0) == 0 ||
            (out->empty() && base.rfind("libtorch.so", 0) == 0))
          *out = name;
        return 0;
      },
      &found);
  if (found.empty()) return "unknown";
  std::error_code ec;
  auto path = std::filesystem::canonical(found, ec);
  return ec ? found : path.string();
}

// The ops and kernels of this build: DeepSpeed's op report, for what dscpp compiles ahead of
// time (there is no JIT: an op is in the build or not). A CUDA kernel is usable where the
// build has CUDA and a device is visible; the ATen paths and the Gloo backend run anywhere.
json op_report(const json& devices) {
  const int cuda_devices = static_cast<int>(devices.size());
  const bool gpu = kCudaBuild && cuda_devices > 0;
  // FP8 tensor cores: compute capability 8.9 (Ada) or later, on every visible device.
  bool fp8_cores = cuda_devices > 0;
  for (const auto& d : devices) {
    const std::string cc = d.value("compute_capability", std::string("0.0"));
    const auto dot = cc.find('.');
    const int major = std::atoi(cc.substr(0, dot).c_str());
    const int minor = dot == std::string::npos ? 0 : std::atoi(cc.substr(dot + 1).c_str());
    fp8_cores = fp8_cores && major * 10 + minor >= 89;
  }
  const std::string why_not =
      !kCudaBuild ? "not in a CPU build (scripts/build.sh cuda)" : "no CUDA device visible";
  json ops = json::array();
  auto add = [&](const char* name, const char* what, bool compiled, bool usable,
                 const std::string& note) {
    ops.push_back({{"name", name},
                   {"description", what},
                   {"compiled", compiled},
                   {"usable", compiled && usable},
                   {"note", compiled && usable ? "" : note}});
  };
  add("fused_adam", "Adam/AdamW on flat fp32 shards, one CUDA kernel (ops/fused_adam.cu)",
      kCudaBuild, gpu, why_not);
  add("bias_gelu_cuda", "bias + GeLU forward and backward kernels (ops/bias_gelu.cu)", kCudaBuild,
      gpu, why_not);
  add("cross_entropy_cuda", "fused cross entropy over the logits (ops/cross_entropy.cu)",
      kCudaBuild, gpu, why_not);
  add("bias_gelu", "bias + GeLU, the ATen path (CPU, float64, mixed dtypes)", true, true, "");
  add("cross_entropy", "cross entropy, the ATen path", true, true, "");
  add("optimizers_aten", "adam, adamw, sgd, adagrad, lamb, lion on ATen (optim/)", true, true, "");
  add("comm_gloo", "c10d ProcessGroupGloo: CPU tensors, any machine", true, true, "");
  add("comm_nccl", "c10d ProcessGroupNCCL: CUDA tensors", kCudaBuild, gpu, why_not);
  add("fp8_linear_cuda", "FP8 linear products on the GPU: at::_scaled_mm (nn/fp8_linear.h)",
      kCudaBuild, gpu && fp8_cores,
      gpu ? "a device below compute capability 8.9: no FP8 tensor cores" : why_not);
  add("fp8_linear", "FP8 linear products on the CPU: ATen's _scaled_mm (tests; slow)", true, true,
      "");
  return ops;
}

json full_report() {
  json r = dscpp::environment_report();
  const json devs = r.contains("cuda") && r["cuda"].is_object() && r["cuda"].contains("devices")
                        ? r["cuda"]["devices"]
                        : json::array();
  const int devices = static_cast<int>(devs.size());
  r["ops"] = op_report(devs);
  r["compiler"] = compiler();
  r["build_type"] = DSCPP_BUILD_TYPE;
  std::error_code ec;
  const auto exe = std::filesystem::canonical("/proc/self/exe", ec);
  r["dscpp_report_path"] = ec ? "unknown" : exe.string();
  r["install_path"] = ec ? "unknown" : exe.parent_path().parent_path().string();
  r["libtorch_library"] = libtorch_library();
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0)
    r["shm_gib"] = static_cast<double>(shm.f_blocks) * shm.f_frsize / (1ull << 30);
  r["cuda_device_count"] = devices;
  return r;
}

std::string dots(const std::string& key, size_t width) {
  return key + " " + std::string(key.size() + 1 < width ? width - key.size() - 1 : 1, '.') + " ";
}

std::string text(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void print_text(const json& r) {
  const std::string rule(50, '-');
  std::cout << rule << "\ndscpp C++/CUDA op report\n"
            << rule << "\n"
            << "NOTE: dscpp compiles its ops ahead of time (there is no JIT): 'compiled'\n"
            << "      says this build holds the op, 'usable' that it can run on this\n"
            << "      machine (a CUDA kernel needs the CUDA build and a visible GPU).\n"
            << rule << "\n"
            << dots("op name", 25) << "compiled .. usable\n"
            << rule << "\n";
  for (const auto& op : r["ops"]) {
    std::cout << dots(op["name"].get<std::string>(), 25)
              << (op["compiled"].get<bool>() ? "[YES]" : "[NO] ") << " ...... "
              << (op["usable"].get<bool>() ? "[OKAY]" : "[NO]  ");
    if (!op["note"].get<std::string>().empty()) std::cout << " (" << text(op["note"]) << ")";
    std::cout << "\n";
  }
  std::cout << rule << "\ndscpp general environment info:\n";
  auto line = [](const std::string& k, const std::string& v) {
    std::cout << dots(k, 34) << v << "\n";
  };
  line("dscpp install path", text(r["install_path"]));
  line("dscpp version", text(r["dscpp"]));
  line("dscpp build type", text(r["build_type"]));
  line("dscpp compiled w.", text(r["compiler"]));
  line("libtorch version", text(r["libtorch"]));
  line("libtorch built for", text(r["libtorch_built_for"]));
  line("libtorch library path", text(r["libtorch_library"]));
  line("cuda build", r["cuda_build"].get<bool>() ? "yes" : "no");
  if (r["cuda"].is_object()) {
    const auto& c = r["cuda"];
    line("cuda runtime version", text(c["runtime"]));
    line("cuda driver version", c["driver"].is_null() ? "none" : text(c["driver"]));
  } else {
    line("cuda runtime version", text(r["cuda"]));
  }
  line("nccl version", r.contains("nccl") ? text(r["nccl"]) : "unknown");
  line("gloo", text(r["gloo"]));
  line("cuda devices", std::to_string(r["cuda_device_count"].get<int>()));
  if (r["cuda"].is_object())
    for (const auto& d : r["cuda"]["devices"])
      line(fmt::format("  cuda:{}", d["index"].get<int>()),
           fmt::format("{} (compute {}, {:.1f} GiB, {} SMs)", text(d["name"]),
                       text(d["compute_capability"]), d["memory_gib"].get<double>(),
                       d["multiprocessors"].get<int>()));
  line("cpu threads", text(r["cpu_threads"]));
  if (r.contains("shm_gib"))
    line("shared memory (/dev/shm) size", fmt::format("{:.2f} GB", r["shm_gib"].get<double>()));
}

// One --config resolution: its exit code, standard output and standard error.
struct Resolution {
  int exit = 0;
  std::string out, err;
};

Resolution resolve(const std::string& config, const dscpp::ConfigOptions& options) {
  Resolution r;
  try {
    dscpp::DSConfig c = dscpp::load_ds_config(config, options);
    // Build what the engine would build from the config: the same checks, the same errors.
    // A schedule without an optimizer in the config drives the program's own; a stand-in
    // Adam takes its place here (schedules read only lr and betas of it).
    std::unique_ptr<dscpp::optim::Optimizer> optimizer =
        dscpp::optim::make_optimizer(c.optimizer ? *c.optimizer : dscpp::OptimizerConfig{"adam"});
    if (c.scheduler) dscpp::optim::make_scheduler(*c.scheduler, *optimizer);
    for (const auto& w : c.warnings) r.err += "dscpp: warning: " + w + "\n";
    for (const auto& i : c.ignored) r.err += "dscpp: " + i + "\n";
    r.out = dscpp::to_json(c).dump(2) + "\n";
  } catch (const dscpp::Error& e) {
    r.exit = 2;
    r.out.clear();
    r.err = std::string("dscpp: config error: ") + e.what() + "\n";
  }
  return r;
}

// --config-list: one request a line in, one result a line out. A malformed request line is
// answered with exit 2 naming the line, and the rest still run.
int resolve_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "dscpp_report: cannot read --config-list file '" << path << "'\n";
    return 2;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Resolution r;
    const json req = json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object() || !req.contains("config") ||
        !req["config"].is_string()) {
      r.exit = 2;
      r.err = fmt::format("dscpp_report: {}:{}: expected {{\"config\": STRING, ...}}\n", path, n);
    } else {
      dscpp::ConfigOptions options;
      options.auto_values_hint = "give it in the request's \"autos\"";
      bool fields_ok = true;
      try {
        options.world_size = req.value("world_size", int64_t{1});
        options.strict = req.value("strict", false);
        if (req.contains("autos")) {
          fields_ok = req["autos"].is_object();
          if (fields_ok) options.auto_values = req["autos"];
        }
      } catch (const json::exception&) {  // a field of the wrong JSON type
        fields_ok = false;
      }
      if (!fields_ok) {
        r = Resolution{2, "",
                       fmt::format("dscpp_report: {}:{}: expected world_size an integer, strict a "
                                   "boolean and autos an object\n",
                                   path, n)};
      } else {
        try {
          r = resolve(req["config"].get<std::string>(), options);
        } catch (const std::exception& e) {  // where --config alone would abort: exit 1
          r = Resolution{
              1, "", std::string("dscpp_report: uncaught: ") + dscpp::comm::error_text(e) + "\n"};
        }
      }
    }
    // Replace what is not UTF-8 (a message may quote the file's bytes) rather than throw.
    std::cout << json{{"exit", r.exit}, {"stdout", r.out}, {"stderr", r.err}}.dump(
                     -1, ' ', false, json::error_handler_t::replace)
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description opts("dscpp_report options");
  std::string config;
  int64_t world_size = 1;
  std::vector<std::string> autos;
  opts.add_options()("help,h", "show this help")("json",
                                                 "print the environment report as one JSON object")(
      "config", po::value(&config), "ds_config file (or JSON text) to resolve and print")(
      "world-size", po::value(&world_size)->default_value(1),
      "data-parallel world size for the batch-size rule")(
      "auto", po::value(&autos)->composing(),
      "KEY=VALUE: a value for an \"auto\" in the config (dotted KEY, JSON VALUE); repeatable")(
      "strict", "unknown keys are errors, not warnings")(
      "config-list", po::value<std::string>(),
      "FILE of JSON requests, one a line: resolve each as --config does, in this one process");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "dscpp_report: " << e.what() << "\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  if (vm.count("config-list")) return resolve_list(vm["config-list"].as<std::string>());
  if (config.empty()) {
    const json r = full_report();
    if (vm.count("json"))
      std::cout << r.dump(2) << "\n";
    else
      print_text(r);
    return 0;
  }
  dscpp::ConfigOptions options;
  options.world_size = world_size;
  options.auto_values_hint = "give it with --auto KEY=VALUE";
  options.strict = vm.count("strict") > 0;
  for (const auto& a : autos) {
    auto eq = a.find('=');
    if (eq == std::string::npos) {
      std::cerr << "dscpp_report: --auto expects KEY=VALUE, got '" << a << "'\n";
      return 2;
    }
    auto value = nlohmann::json::parse(a.substr(eq + 1), nullptr, false);
    if (value.is_discarded()) value = a.substr(eq + 1);  // a bare word is a string
    options.auto_values[a.substr(0, eq)] = value;
  }
  const Resolution r = resolve(config, options);
  std::cout << r.out;
  std::cerr << r.err;
  return r.exit;
}
