// Checkpoints of experts with tensor parallelism, on 4 Gloo ranks: the tiny MoE GPT
// of tp_moe_engine (dropless, so every layout trains the one-rank model) at tensor 2 x data 2,
// ep 2 trains 3 steps, saves, and trains 3 more (--phase save). A second launch (--phase
// resume: the saving processes are gone) checks DeepSpeed's file names (mp_rank_XX model
// states, layer_L_expert_E_mp_rank_XX for both tensor ranks, zero_pp_rank_D_mp_rank_XX or at
// ZeRO 0 expp_rank_R_mp_rank_XX) and that the two tensor ranks' expert files are equal, then
// loads the checkpoint, from other initial weights,
//   - at tensor 2 x data 2, ep 2: the next 3 steps' losses bit for bit the uninterrupted run's;
//   - at tensor 2 x data 2, ep 1, at tensor 1 x data 4, ep 2 (model_zoo's GPT, the saved ZeRO
//     stage), and into the plain one-rank engine (model_zoo's GPT at tensor 1, ep 1, the global
//     batch on one rank, ZeRO 0): within 1e-5 relative;
// zero_to_fp32 of the checkpoint is the weights the one-rank engine loaded, bit for bit, and
// to_universal's (the checkpoint's normal form) are zero_to_fp32's; and with the first case: a
// missing expert file is refused naming it, loading at ZeRO 3 is refused naming the stage.
//   tp_moe_checkpoint --phase save|resume --dir DIR --case e2k<k>d1s<s>z<stage>g<ga> [...]
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/runtime/checkpoint/fp32_state.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "tests/runtime/engine/tp_common.h"
#include "tests/runtime/engine/tp_moe_common.h"

using tp_test::check;
using namespace tp_moe_test;
namespace fs = std::filesystem;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

namespace {

constexpr int kSaveAt = 3, kSteps = 6, kData = 2;

// Where one engine trains: its data group (null: one rank), data rank and micro-batch.
struct Place {
  GroupPtr data;
  int d = 1, dp_rank = 0, micro = kMicro * kData;
};

// Steps [first, last): every micro-step's loss averaged over the data group (the global batch's
// mean, as the one-rank engine sees it).
template <typename Engine, typename Model>
std::vector<double> train(Engine& eng, Model& model, const Place& at, const Case& c, int first,
                          int last) {
  auto loss_of = [&](const at::Tensor& logits, const at::Tensor& target) {
    return model->loss(logits, target);
  };
  std::vector<double> out;
  for (int step = first; step < last; ++step) {
    const at::Tensor tokens = tp_test::batch(step, int64_t{kMicro} * kData * c.ga);
    for (int m = 0; m < c.ga; ++m) {
      const at::Tensor all = tokens.narrow(0, int64_t{m} * kMicro * kData, kMicro * kData);
      at::Tensor loss =
          train_loss(eng, all.narrow(0, int64_t{at.dp_rank} * at.micro, at.micro), loss_of);
      eng.backward(loss);
      eng.step();
      at::Tensor mean = loss.detach().clone();
      if (at.d > 1) at.data->all_reduce(mean).wait();
      out.push_back(mean.item<double>() / at.d);
    }
  }
  return out;
}

// The tensor 2 x data 2 model at expert degree `ep`, initial weights of `seed`, and its engine.
mz::TensorParallelGPT tp_model(const tp_test::Groups& g, const std::map<int, GroupPtr>& ep_groups,
                               const Case& c, int ep, int seed) {
  at::manual_seed(seed);
  return mz::TensorParallelGPT(moe_config(c, g.t, ep), g.model,
                               ep > 1 ? ep_groups.at(ep) : nullptr);
}
struct TpRun {
  mz::TensorParallelGPT model;
  dscpp::Engine<mz::TensorParallelGPT> eng;
  TpRun(const tp_test::Groups& g, const std::map<int, GroupPtr>& ep_groups, const Case& c, int ep,
        int stage, int seed)
      : model(tp_model(g, ep_groups, c, ep, seed)), eng(make(g, c, stage)) {}
  dscpp::Engine<mz::TensorParallelGPT> make(const tp_test::Groups& g, const Case& c, int stage) {
    dscpp::InitArgs args;
    args.group = g.data;
    args.model_group = g.model;
    return dscpp::initialize(model, ds_config(kMicro, c, stage), std::move(args));
  }
};

void write_losses(const std::string& path, const std::vector<double>& losses) {
  std::ofstream f(path);
  for (double l : losses) f << fmt::format("{:a}\n", l);  // hex: read back bit for bit
}

std::vector<double> read_losses(const std::string& path) {
  std::ifstream f(path);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);) out.push_back(std::strtod(line.c_str(), nullptr));
  return out;
}

void compare(const std::string& where, const std::vector<double>& got,
             const std::vector<double>& want, double tolerance, int rank) {
  check(got.size() == want.size() && !want.empty(), where + ": as many losses as the run", rank);
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    check(tolerance == 0 ? got[i] == want[i]
                         : std::abs(got[i] - want[i]) <= tolerance * std::abs(want[i]),
          where + fmt::format(": micro-step {} loss {:.9g} vs {:.9g} (uninterrupted)", i, got[i],
                              want[i]),
          rank);
}

// DeepSpeed's names, for both tensor ranks; each tensor rank's expert files equal.
void check_files(const std::string& tag, const Case& c, int rank) {
  for (int mp = 0; mp < 2; ++mp) {
    std::vector<std::string> names = {fmt::format("mp_rank_{:02d}_model_states.pt", mp)};
    for (int layer = 0; layer < 2; ++layer)
      for (int e = 0; e < 4; ++e)
        names.push_back(
            fmt::format("layer_{}_expert_{}_mp_rank_{:02d}_model_states.pt", layer, e, mp));
    for (int r = 0; r < 2; ++r)
      names.push_back(c.stage == 0
                          ? fmt::format("expp_rank_{}_mp_rank_{:02d}_optim_states.pt", r, mp)
                          : fmt::format("zero_pp_rank_{}_mp_rank_{:02d}_optim_states.pt", r, mp));
    for (const auto& n : names) check(fs::exists(tag + n), c.name + ": the save wrote " + n, rank);
  }
  namespace ck = dscpp::checkpoint;
  const ck::PyValue a = ck::load_torch_file(tag + "layer_1_expert_3_mp_rank_00_model_states.pt");
  const ck::PyValue b = ck::load_torch_file(tag + "layer_1_expert_3_mp_rank_01_model_states.pt");
  bool same = a.size() == b.size() && a.size() > 0;
  for (size_t i = 0; same && i < a.size(); ++i)
    same = a.keys()[i].as_string() == b.keys()[i].as_string() &&
           at::equal(a.values()[i].as_tensor(), b.values()[i].as_tensor());
  check(same, c.name + ": expert 3 of layer 1 is the same in mp_rank_00 and mp_rank_01", rank);
}

// load_checkpoint refused on every rank with a message holding `want`.
void refused(const std::string& what, const std::string& want, const std::function<void()>& load,
             int rank) {
  try {
    load();
    check(false, what + ": accepted", rank);
  } catch (const std::exception& e) {
    check(std::string(e.what()).find(want) != std::string::npos,
          what + ": the refusal names " + want + ": " + e.what(), rank);
  }
}

void save_phase(const std::string& dir, const tp_test::Groups& g,
                const std::map<int, GroupPtr>& ep_groups, const Case& c) {
  TpRun run(g, ep_groups, c, c.ep, c.stage, 1);
  const Place at{g.data, g.d, g.dp_rank, kMicro};
  (void)train(run.eng, run.model, at, c, 0, kSaveAt);
  run.eng.save_checkpoint(dir);
  const auto after = train(run.eng, run.model, at, c, kSaveAt, kSteps);
  if (g.dp_rank == 0 && g.tp_rank == 0) write_losses(dir + "/uninterrupted.txt", after);
}

// resume_phase's groups of tensor 1 x data 4 (the world) and its expert degree 2.
struct DataWorld {
  tp_test::Groups g;
  GroupPtr ep2;
};

void resume_phase(const std::string& dir, dscpp::comm::ProcessGroup& world,
                  const tp_test::Groups& g, const std::map<int, GroupPtr>& ep_groups,
                  const DataWorld& d4, const Case& c, bool refusals) {
  const int rank = world.rank();
  const std::string tag = fmt::format("{}/global_step{}/", dir, kSaveAt);
  const auto want = read_losses(dir + "/uninterrupted.txt");
  if (rank == 0) check_files(tag, c, rank);
  const Place tp{g.data, g.d, g.dp_rank, kMicro};
  for (int ep : {c.ep, 1}) {
    TpRun run(g, ep_groups, c, ep, c.stage, 2);  // other weights: the load must replace them
    run.eng.load_checkpoint(dir);
    check(run.eng.global_steps() == kSaveAt, c.name + ": the step count restored", rank);
    compare(fmt::format("{}: resumed at tensor 2 x data 2, ep {}", c.name, ep),
            train(run.eng, run.model, tp, c, kSaveAt, kSteps), want, ep == c.ep ? 0 : 1e-5, rank);
  }
  {  // tensor 1 x data 4 at ep 2: model_zoo's GPT, one row per rank
    at::manual_seed(2);
    mz::GPT m(moe_config(c, 1, 2), d4.ep2);
    dscpp::InitArgs args;
    args.group = d4.g.data;
    auto eng = dscpp::initialize(m, ds_config(1, c, c.stage), std::move(args));
    eng.load_checkpoint(dir);
    compare(c.name + ": resumed at tensor 1 x data 4, ep 2",
            train(eng, m, Place{d4.g.data, 4, d4.g.dp_rank, 1}, c, kSaveAt, kSteps), want, 1e-5,
            rank);
  }
  {  // the plain one-rank engine: model_zoo's GPT at ep 1 on a group of this rank alone
    at::manual_seed(2);
    mz::GPT m(moe_config(c, 1, 1));
    dscpp::InitArgs args;
    args.group = g.self;
    auto eng = dscpp::initialize(m, ds_config(kMicro * kData, c, 0), std::move(args));
    eng.load_checkpoint(dir);
    if (rank == 0) {
      const auto sd = dscpp::checkpoint::get_fp32_state_dict_from_zero_checkpoint(dir);
      size_t n = 0;
      for (const auto& p : m->named_parameters()) {
        const auto* v = sd.find(dscpp::checkpoint::PyValue(p.key()));
        n += v != nullptr;
        check(v && v->is_tensor() && at::equal(v->as_tensor(), p.value()),
              c.name + ": zero_to_fp32's " + p.key() + " is the one-rank engine's loaded weight",
              rank);
      }
      check(n == m->named_parameters().size() && sd.size() >= n,
            c.name + ": zero_to_fp32 names every one-rank parameter", rank);
    }
    compare(c.name + ": resumed on one rank (tensor 1, ep 1)",
            train(eng, m, Place{}, c, kSaveAt, kSteps), want, 1e-5, rank);
  }
  if (rank == 0) {
    // The normal form (to_universal's): the one-rank model's fp32 weights, as zero_to_fp32's.
    const auto sd = dscpp::checkpoint::get_fp32_state_dict_from_zero_checkpoint(dir);
    const auto u = dscpp::checkpoint::universal_from_zero_checkpoint(dir);
    bool same = !u.params.empty();
    for (const auto& p : u.params) {
      const auto* v = sd.find(dscpp::checkpoint::PyValue(p.name));
      same = same && v && v->is_tensor() && at::equal(v->as_tensor(), p.fp32);
    }
    check(same && u.params.size() == sd.size(),
          c.name + ": to_universal's weights are zero_to_fp32's, every one", rank);
  }
  if (!refusals) return;
  const std::string gone = "layer_1_expert_2_mp_rank_01_model_states.pt";
  const std::string missing = dir + "_missing";
  if (rank == 0) {
    fs::copy(dir, missing, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    fs::remove(fmt::format("{}/global_step{}/{}", missing, kSaveAt, gone));
  }
  world.barrier().wait();
  {
    TpRun run(g, ep_groups, c, c.ep, c.stage, 2);
    refused(
        c.name + ": a missing expert file", gone, [&] { run.eng.load_checkpoint(missing); }, rank);
  }
  {
    TpRun run(g, ep_groups, c, c.ep, 3, 2);
    refused(
        c.name + ": loading at ZeRO 3", "a MoE checkpoint loads, at ZeRO stages 0-2",
        [&] { run.eng.load_checkpoint(dir); }, rank);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string phase, dir;
  std::vector<Case> cases;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--phase") phase = value;
    if (flag == "--dir") dir = value;
    if (flag == "--case") cases.push_back(parse_case(value));
  }
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  const int rank = world->rank();
  try {
    if ((phase != "save" && phase != "resume") || dir.empty() || cases.empty() ||
        world->size() != 4)
      throw dscpp::Error(
          "usage: 4 ranks, tp_moe_checkpoint --phase save|resume --dir DIR --case ...");
    // Every rank makes every group in the same order, whichever it uses.
    const auto g = tp_test::make_groups(*world, 2);
    dscpp::comm::Topology topo({"pipe", "data", "model"}, {1, g.d, 2});
    const std::map<int, GroupPtr> ep_groups = {
        {2, dscpp::comm::new_expert_groups(*world, topo, 2).expert_parallel}};
    DataWorld d4{tp_test::make_groups(*world, 1), nullptr};
    d4.ep2 = dscpp::comm::new_expert_groups(
                 *world, dscpp::comm::Topology({"pipe", "data", "model"}, {1, 4, 1}), 2)
                 .expert_parallel;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      if (c.ep != 2 || !c.dropless)
        throw dscpp::Error("tp_moe_checkpoint: case " + c.name + ": saved at ep 2, dropless");
      const std::string at = dir + "/" + c.name;
      if (phase == "save") {
        save_phase(at, g, ep_groups, c);
      } else {
        resume_phase(at, *world, g, ep_groups, d4, c, i == 0);
        if (rank == 0) std::cout << "tp_moe_checkpoint: case " << c.name << " checked\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return tp_test::failures == 0 ? 0 : 1;
}
