// The MoE layer with sequence parallelism (nn/moe/moe.h: sequence_parallel, the tensor group's
// shard as input) on 4 Gloo ranks = data 2 x tensor 2 (tensor fastest), expert degree 1 or 2
// (the expert-parallel group across the data ranks of one tensor rank), against the one-rank
// layer holding every expert with the same weights and expert bias, fp32, 1e-5 relative:
//   - each rank's output is the one-rank layer's on that rank's shard alone (Megatron's
//     capacity: the shard's tokens decide the capacity and the drops), so with a capacity the
//     layer at t = 2 equals t one-rank layers, one on each 1/t of the sequence;
//   - exp_counts and the router's expert-bias counts are the one-rank layer's on the whole
//     micro-batch [T, B] (summed over the tensor group, counted once), and the aux losses (l_aux,
//     z-loss, sequence-wise loss) summed over the tensor group are the one-rank layer's on it;
//   - the gradients of sum(output x R) + the losses: the input's shard is the one-rank one's,
//     the router's weight (and LatentMoE's projections) summed over the world, the experts
//     summed over the tensor group at ep 2 (the all-to-all brings both data ranks' tokens) and
//     over the world at ep 1, are the one-rank layer's gradients of the same sum over both data
//     ranks (output terms per shard, losses per whole micro-batch);
//   - tensor_parallel_attributes marks the experts, the router's weight and the latent
//     projections sequence_parallel; a layer asked for sequence parallelism without a tensor
//     group of more than one rank is refused by name.
// Cases: top-1 and top-2, dropless and capacity factor 0.5, aux loss or sequence-wise aux loss
// (with z-loss in both), LatentMoE on and off, ep 1 and 2; a covering set by default, every
// combination with --full.
//   moe_sp_layer [--full]
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "tests/moe_test_util.h"

using moe_test::Case, moe_test::check, moe_test::check_close, moe_test::counterpart,
    moe_test::GroupPtr, moe_test::kExperts, moe_test::kHidden, moe_test::rel_err;
namespace moe = dscpp::nn::moe;

namespace {

constexpr int64_t kSeq = 12, kBatch = 2;
constexpr int kTensor = 2, kData = 2;

struct Groups {
  GroupPtr world, model, data, ep;  // ep: across the data ranks of this tensor rank
  int tp_rank = 0, dp_rank = 0;
};

struct SpCase {
  int ep = 1, k = 1;
  bool dropless = true, seq_aux = false, latent = false;
  std::string name() const {
    return "e" + std::to_string(ep) + "k" + std::to_string(k) +
           (dropless ? " dropless" : " capacity") + (seq_aux ? " seq_aux" : " aux") +
           (latent ? " latent" : "");
  }
};

moe::MoEOptions options(const SpCase& s, int ep, const GroupPtr& ep_group) {
  Case c = moe_test::parse_case("e" + std::to_string(ep) + "k" + std::to_string(s.k) + "d" +
                                    std::to_string(s.dropless) + "l" + std::to_string(s.latent),
                                "ekdl", "moe_sp_layer");
  return moe_test::moe_options(c, ep, ep_group)
      .z_loss_coeff(1e-2)
      .seq_aux_loss_coeff(s.seq_aux ? 0.1 : 0.0)
      .enable_expert_bias(true);
}

// Data rank d's micro-batch [T, B, H] (the same on every rank) and the weights of its output.
at::Tensor input_of(int d) {
  return at::randn({kSeq, kBatch, kHidden}, at::detail::createCPUGenerator(100 + d));
}
at::Tensor weights_of(int d) {
  return at::randn({kSeq, kBatch, kHidden}, at::detail::createCPUGenerator(200 + d));
}
at::Tensor shard(const at::Tensor& x, int tp) {
  return x.narrow(0, tp * kSeq / kTensor, kSeq / kTensor);
}

at::Tensor summed(const at::Tensor& t, const GroupPtr& group) {
  at::Tensor out = t.detach().clone().contiguous();
  group->all_reduce(out).wait();
  return out;
}

void run_case(const Groups& g, const SpCase& s) {
  const int rank = g.world->rank();
  const std::string where = "case " + s.name() + ": ";

  // The one-rank layer, and the layer under test with its weights and bias.
  at::manual_seed(5);
  moe::MoE ref(options(s, 1, nullptr));
  moe::MoE sp(options(s, s.ep, g.ep).tensor_group(g.model).sequence_parallel(true));
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& p : ref->named_parameters()) ref_params[p.key()] = p.value();
  const auto experts = moe::expert_parameters(*sp);
  {
    at::NoGradGuard no_grad;
    for (const auto& p : sp->named_parameters())
      p.value().copy_(counterpart(ref_params, experts, p.key()));
    const at::Tensor bias = at::randn({kExperts}, at::detail::createCPUGenerator(7)).mul_(0.05);
    ref->deepspeed_moe->gate->expert_bias.copy_(bias);
    sp->deepspeed_moe->gate->expert_bias.copy_(bias);
  }

  // The one-rank layer over both data ranks: output terms per shard, losses per micro-batch.
  std::vector<at::Tensor> xs;
  at::Tensor ref_loss = at::zeros({});
  at::Tensor mine_out, whole_l_aux, whole_aux, whole_counts;
  for (int d = 0; d < kData; ++d) {
    xs.push_back(input_of(d).requires_grad_());
    for (int tp = 0; tp < kTensor; ++tp) {
      dscpp::nn::AuxLossScope ignored;  // a shard's own losses are not the layer's
      at::Tensor out = ref->forward(shard(xs[d], tp)).output;
      ref_loss = ref_loss + (out * shard(weights_of(d), tp)).sum();
      if (d == g.dp_rank && tp == g.tp_rank) mine_out = out.detach();
    }
    dscpp::nn::AuxLossScope aux;
    // Batch-major [B, T, H]: the one-rank layer's sequences.
    moe::MoEOutput whole = ref->forward(xs[d].transpose(0, 1).contiguous());
    ref_loss = ref_loss + whole.l_aux + aux.sum();
    if (d == g.dp_rank) {
      whole_l_aux = whole.l_aux.detach();
      whole_aux = aux.sum().detach();
      whole_counts = whole.exp_counts;
    }
  }
  ref_loss.backward();

  // The layer under test on this rank's shard.
  at::Tensor x = shard(input_of(g.dp_rank), g.tp_rank).contiguous().requires_grad_();
  dscpp::nn::AuxLossScope aux;
  moe::MoEOutput out = sp->forward(x);
  at::Tensor loss = (out.output * shard(weights_of(g.dp_rank), g.tp_rank)).sum() + out.l_aux;
  check(aux.sum().defined(), where + "the z-loss (and sequence-wise loss) reached the channel",
        rank);
  if (aux.sum().defined()) loss = loss + aux.sum();
  loss.backward();

  check(rel_err(out.output, mine_out) <= 1e-5,
        where + "output = the one-rank layer's on this shard: " +
            std::to_string(rel_err(out.output, mine_out)),
        rank);
  check(at::equal(out.exp_counts, whole_counts),
        where + "exp_counts = the one-rank layer's on the whole micro-batch", rank);
  check(at::equal(sp->deepspeed_moe->gate->tokens_per_expert(), whole_counts.to(at::kFloat)),
        where + "the expert-bias counts: the micro-batch's, once", rank);
  check_close(summed(out.l_aux, g.model).item<double>(), whole_l_aux.item<double>(),
              where + "l_aux summed over the tensor group", rank);
  if (aux.sum().defined())
    check_close(summed(aux.sum(), g.model).item<double>(), whole_aux.item<double>(),
                where + "z-loss + sequence-wise loss summed over the tensor group", rank);
  const at::Tensor want_dx = shard(xs[g.dp_rank].grad(), g.tp_rank);
  check(rel_err(x.grad(), want_dx) <= 1e-5,
        where + "input gradient: " + std::to_string(rel_err(x.grad(), want_dx)), rank);

  std::map<std::string, at::Tensor> ref_grads;
  for (const auto& p : ref->named_parameters()) ref_grads[p.key()] = p.value().grad();
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*sp);
  for (const auto& p : sp->named_parameters()) {
    const bool expert = experts.count(p.key()) > 0;
    check(attrs.at(p.key()).sequence_parallel, where + p.key() + " marked sequence_parallel", rank);
    // An expert at ep 2 already saw both data ranks' tokens of this tensor rank's shards.
    const at::Tensor got = summed(p.value().grad(), expert && s.ep > 1 ? g.model : g.world);
    const at::Tensor want = counterpart(ref_grads, experts, p.key());
    check(rel_err(got, want) <= 1e-5,
          where + p.key() + " gradient: " + std::to_string(rel_err(got, want)), rank);
  }
}

void refusal(const Groups& g) {
  try {
    moe::MoE layer(options(SpCase{}, 1, nullptr).sequence_parallel(true));
    check(false, "sequence_parallel without a tensor group: accepted", g.world->rank());
  } catch (const dscpp::Error& e) {
    check(
        std::string(e.what()).find("sequence_parallel needs the tensor_group") != std::string::npos,
        std::string("sequence_parallel without a tensor group refused by name: ") + e.what(),
        g.world->rank());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool full = false;
  for (int i = 1; i < argc; ++i) full |= std::string(argv[i]) == "--full";
  dscpp::comm::InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(120);
  Groups g;
  g.world = dscpp::comm::init_distributed(init);
  if (g.world->size() != kTensor * kData) {
    std::cerr << "moe_sp_layer: needs 4 ranks\n";
    return 2;
  }
  try {
    dscpp::comm::Topology topo({"pipe", "data", "model"}, {1, kData, kTensor});
    for (const auto& ranks : topo.get_axis_comm_lists("model"))
      if (auto sub = g.world->new_subgroup(ranks)) g.model = sub;
    for (const auto& ranks : topo.get_axis_comm_lists("data"))
      if (auto sub = g.world->new_subgroup(ranks)) g.data = sub;
    g.ep = dscpp::comm::new_expert_groups(*g.world, topo, 2).expert_parallel;
    const auto coord = topo.get_coord(g.world->rank());
    g.tp_rank = coord.at("model");
    g.dp_rank = coord.at("data");

    std::vector<SpCase> cases;
    if (full) {
      for (int ep : {1, 2})
        for (int k : {1, 2})
          for (bool dropless : {true, false})
            for (bool seq_aux : {false, true})
              for (bool latent : {false, true}) cases.push_back({ep, k, dropless, seq_aux, latent});
    } else {
      cases = {{1, 1, true, false, false},
               {2, 2, true, true, false},
               {2, 1, false, false, true},
               {1, 2, false, true, false},
               {2, 2, false, false, false}};
    }
    for (const auto& s : cases) {
      run_case(g, s);
      if (g.world->rank() == 0) std::cout << "case " << s.name() << ": done\n";
    }
    refusal(g);
  } catch (const std::exception& e) {
    std::cerr << "rank " << g.world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  g.world->barrier().wait();
  return moe_test::failures == 0 ? 0 : 1;
}
