#include "options.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <sstream>

namespace dscpp::launcher {
namespace po = boost::program_options;
namespace {

struct Parsed {
  Options opt;
  int num_accelerators = -1;
  int ssh_port = -1;
  std::string venv_script;
  std::string bind_core_list;
  std::string world_info;
  std::string each_rank_log = "None";
};

po::options_description visible_options(Parsed& p) {
  Options& o = p.opt;
  po::options_description desc("Options");
  // clang-format off
  desc.add_options()
    ("help,h", po::bool_switch(&o.help), "show this help and exit")
    ("hostfile,H", po::value(&o.hostfile)->value_name("PATH"),
     "hostfile ('HOST slots=N' lines) defining the resource pool; default /job/hostfile, "
     "single node when that file does not exist")
    ("include,i", po::value(&o.include)->value_name("SPEC"),
     "resources to use, NODE_SPEC[@NODE_SPEC ...] with NODE_SPEC=NAME[:SLOT[,SLOT ...]]")
    ("exclude,e", po::value(&o.exclude)->value_name("SPEC"),
     "resources not to use, same syntax as --include (mutually exclusive with it)")
    ("num_nodes", po::value(&o.num_nodes)->value_name("N"), "use the first N hosts of the hostfile")
    ("num_gpus", po::value(&o.num_gpus)->value_name("N"),
     "ranks per node, using device ids [0, N); without GPUs, N CPU ranks")
    ("num_accelerators", po::value(&p.num_accelerators)->value_name("N"), "alias of --num_gpus")
    ("oversubscribe", po::bool_switch(&o.oversubscribe),
     "without GPUs, allow more than 64 CPU ranks per core")
    ("master_addr", po::value(&o.master_addr)->value_name("ADDR"),
     "address of node 0 (default 127.0.0.1 on one node, `hostname -I` of the first host otherwise)")
    ("master_port", po::value(&o.master_port)->value_name("PORT"),
     "rendezvous port (default 29500); 0 on one node: a free port, the same for every rank")
    ("node_rank", po::value(&o.node_rank)->value_name("K"),
     "with --no_ssh: which host of the hostfile this launcher runs")
    ("launcher", po::value(&o.launcher)->value_name("NAME"),
     "multi-node backend: pdsh (default), openmpi, mpich, slurm or ssh")
    ("launcher_args", po::value(&o.launcher_args)->value_name("ARGS"),
     "extra arguments for the backend, as one quoted string")
    ("no_ssh", po::bool_switch(&o.no_ssh),
     "run this node's share only (with --node_rank); start one dscpp per node yourself")
    ("no_ssh_check", po::bool_switch(&o.no_ssh_check), "skip the passwordless-ssh check")
    ("force_multi", po::bool_switch(&o.force_multi), "use the multi-node backend even for one host")
    ("ssh_port", po::value(&p.ssh_port)->value_name("PORT"), "ssh port for remote hosts")
    ("venv_script", po::value(&p.venv_script)->value_name("PATH"),
     "script sourced on every host before dscpp starts (pdsh and ssh backends)")
    ("no_local_rank", po::bool_switch(&o.no_local_rank),
     "do not pass --local_rank=N to the program")
    ("save_pid", po::value(&o.save_pid_owner)->implicit_value(0)->value_name("PID"),
     "write the launcher pid to /tmp/<pid>.deepspeed and the rank pids to "
     "/tmp/<pid>.deepspeed.ranks")
    ("enable_each_rank_log", po::value(&p.each_rank_log)->value_name("DIR"),
     "write each rank's stdout and stderr to DIR/<timestamp>_rank<R>.log")
    ("bind_cores_to_rank", po::bool_switch(&o.bind_cores_to_rank),
     "bind each rank to its own share of the node's cores and set OMP_NUM_THREADS")
    ("bind_core_list", po::value(&p.bind_core_list)->value_name("LIST"),
     "cores to share out with --bind_cores_to_rank, e.g. 0,2-5 (default: all physical cores)")
    ("module", po::bool_switch(&o.module), "Python only; ignored with a notice")
    ("no_python", po::bool_switch(&o.no_python), "run the program directly even when its name ends in .py (otherwise a .py program runs as "
     "$DSCPP_PYTHON or python3 -u PROGRAM)")
    ("log_level", po::value(&o.log_level)->value_name("LEVEL"),
     "debug, info (default), warning, error or critical")
    ("quiet,q", po::bool_switch(&o.quiet), "print errors only (same as --log_level error)");
  // clang-format on
  return desc;
}

po::options_description internal_options(Parsed& p) {
  po::options_description desc("Internal");
  // clang-format off
  desc.add_options()
    ("world_info", po::value(&p.world_info))
    ("exit_on_stdin_eof", po::bool_switch(&p.opt.exit_on_stdin_eof));
  // clang-format on
  return desc;
}

// Boost.Program_options has no "stop at the first positional" mode, so the command line is
// split here and only the dscpp part reaches it. Options are rewritten to `--name=value`
// so that a value which looks like a flag (--launcher_args "-x FOO") stays a value.
std::vector<std::string> split_command_line(const po::options_description& desc,
                                            const std::vector<std::string>& args, Options& opt) {
  std::vector<std::string> own;
  size_t i = 0;
  auto lookup = [&](const std::string& name, const std::string& shown) {
    const po::option_description* od = desc.find_nothrow(name, false);
    if (od == nullptr) throw UsageError(fmt::format("unrecognized option '{}'", shown));
    return od;
  };
  auto needs_value = [](const po::option_description* od) {
    return od->semantic()->min_tokens() > 0;
  };
  while (i < args.size()) {
    const std::string& token = args[i];
    if (token == "--") {
      ++i;
      break;
    }
    if (token.size() > 2 && token.compare(0, 2, "--") == 0) {
      const size_t eq = token.find('=');
      const std::string name =
          token.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const po::option_description* od = lookup(name, "--" + name);
      if (eq == std::string::npos && needs_value(od)) {
        if (i + 1 >= args.size()) {
          throw UsageError(fmt::format("option '--{}' requires a value", name));
        }
        own.push_back(fmt::format("--{}={}", name, args[i + 1]));
        i += 2;
      } else {
        own.push_back(token);
        ++i;
      }
      continue;
    }
    if (token.size() > 1 && token[0] == '-') {
      const std::string name = token.substr(0, 2);
      const po::option_description* od = lookup(name, name);
      if (!needs_value(od)) {
        if (token.size() > 2) throw UsageError(fmt::format("unrecognized option '{}'", token));
        own.push_back("--" + od->long_name());
        ++i;
      } else if (token.size() > 2) {
        own.push_back(fmt::format("--{}={}", od->long_name(), token.substr(2)));
        ++i;
      } else {
        if (i + 1 >= args.size()) {
          throw UsageError(fmt::format("option '{}' requires a value", name));
        }
        own.push_back(fmt::format("--{}={}", od->long_name(), args[i + 1]));
        i += 2;
      }
      continue;
    }
    break;
  }
  if (i < args.size()) {
    opt.program = args[i];
    opt.program_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  }
  return own;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

Options parse_options(const std::vector<std::string>& args) {
  Parsed p;
  po::options_description all;
  all.add(visible_options(p)).add(internal_options(p));

  const std::vector<std::string> own = split_command_line(all, args, p.opt);
  po::variables_map vm;
  try {
    auto style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::command_line_parser(own).options(all).style(style).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }

  Options opt = p.opt;
  if (opt.help) return opt;
  opt.hostfile_given = vm.count("hostfile") > 0;
  if (vm.count("num_accelerators")) {
    if (vm.count("num_gpus") && opt.num_gpus != p.num_accelerators) {
      throw UsageError("--num_gpus and --num_accelerators disagree");
    }
    opt.num_gpus = p.num_accelerators;
  }
  // DeepSpeed's -1 means "not given"; given, a count must be one.
  if ((vm.count("num_gpus") || vm.count("num_accelerators")) && opt.num_gpus <= 0) {
    throw UsageError(
        fmt::format("--num_gpus {}: expected a positive number of ranks per node", opt.num_gpus));
  }
  if (vm.count("num_nodes") && opt.num_nodes <= 0) {
    throw UsageError(
        fmt::format("--num_nodes {}: expected a positive number of nodes", opt.num_nodes));
  }
  if (vm.count("ssh_port")) opt.ssh_port = p.ssh_port;
  if (vm.count("venv_script")) opt.venv_script = p.venv_script;
  if (vm.count("bind_core_list")) opt.bind_core_list = p.bind_core_list;
  if (vm.count("world_info")) opt.world_info = p.world_info;
  opt.save_pid = vm.count("save_pid") > 0;
  // DeepSpeed spells "no per-rank logs" as the string None.
  opt.each_rank_log = p.each_rank_log == "None" ? "" : p.each_rank_log;
  opt.launcher = lower(opt.launcher);
  opt.log_level = lower(opt.log_level);

  static const char* kLevels[] = {"debug", "info", "warning", "error", "critical"};
  if (std::find(std::begin(kLevels), std::end(kLevels), opt.log_level) == std::end(kLevels)) {
    throw UsageError(
        fmt::format("invalid --log_level '{}' (choose from debug, info, warning, error, critical)",
                    opt.log_level));
  }
  if (opt.quiet) opt.log_level = "error";
  if (opt.master_port < 0 || opt.master_port > 65535) {
    throw UsageError(fmt::format("--master_port {} is not a valid port", opt.master_port));
  }
  // A per-node launcher of a multi-node job needs the port the runner gave every host.
  if (opt.master_port == 0 && opt.world_info) {
    throw UsageError(
        "--master_port 0 (a free port) needs a single-node job; --world_info is "
        "a multi-node job's: give the port the runner chose");
  }
  if (opt.program.empty()) {
    throw UsageError("the program to launch is missing (usage: dscpp [options] program [args...])");
  }
  return opt;
}

std::string usage_text() {
  Parsed p;
  std::ostringstream out;
  out << "usage: dscpp [options] program [program args...]\n\n"
         "Starts one process (rank) per device on this node or, with a hostfile, on every\n"
         "host. Everything after the program is passed to it unchanged.\n\n"
      << visible_options(p)
      << "\nEnvironment: DSCPP_KILL_GRACE_S (seconds between SIGTERM and SIGKILL at teardown, "
         "default 5),\nCUDA_VISIBLE_DEVICES, DS_ENV_FILE (default .deepspeed_env).\n";
  return out.str();
}

}  // namespace dscpp::launcher
