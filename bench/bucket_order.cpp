// bucket_order [--buckets N] [--configs DIR]: how many of ZeRO's gradient buckets are issued
// while backward still runs, under the first layout (reverse registration order, the guess
// made before any backward) and under the layout the first backward makes, in the order it
// made the gradients ready. For the dense GPT, the Llama-style GPT, the MoE GPT (model_zoo's tiny
// configs, with a vocabulary of 128 so that the blocks, not the embedding, fill the buckets),
// the tensor-parallel GPT and a model whose modules are registered in the reverse of their use.
//
// It shows what laying out by the first backward earns: a bucket not issued before backward
// ends is a reduction that cannot overlap backward. One process, a no-op group of 2 ranks
// (ZeRO issues its reductions as on 2 ranks; no data moves), ZeRO-2 with overlap_comm, about N
// buckets a model (default 12); each layout is measured at its second backward (the guess kept
// by asking for the optimizer's parts before the first). Prints one table row per model.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <string>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/linear.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/zero_optimizer.h"

namespace mz = dscpp::model_zoo;
namespace po = boost::program_options;

namespace {

// Six linears registered in the reverse of the order forward uses them.
struct ReversedMlpImpl : torch::nn::Module {
  std::vector<at::Tensor> w;
  ReversedMlpImpl() {
    for (int i = 5; i >= 0; --i)
      w.insert(w.begin(), register_parameter(fmt::format("layer{}", i), at::randn({64, 64}) * 0.1));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (const auto& weight : w) h = at::tanh(dscpp::nn::linear(h, weight));
    return h;
  }
};
TORCH_MODULE(ReversedMlp);

struct Row {
  int64_t params = 0;
  size_t buckets = 0;
  int guess = 0, ready = 0;  // buckets issued during backward
};

// Two backward-and-step rounds of `loss` (a closure over the model) under ZeRO-2, on each layout.
template <class Loss>
Row measure(torch::nn::Module& model, Loss loss, int want_buckets) {
  std::vector<at::Tensor> params;
  int64_t n = 0;
  for (auto& p : model.parameters()) {
    params.push_back(p);
    n += p.numel();
  }
  dscpp::zero::ZeroOptions o;
  o.stage = 2;
  o.overlap_comm = true;
  o.reduce_bucket_size = (n + want_buckets - 1) / want_buckets;
  dscpp::OptimizerConfig c;
  c.type = "sgd";
  c.params = {{"lr", 1e-3}};
  Row row;
  row.params = n;
  for (bool guess : {true, false}) {
    dscpp::zero::ZeroOptimizer zo(params, dscpp::optim::make_optimizer(c),
                                  dscpp::comm::make_no_op_group(0, 2), o);
    row.buckets = zo.layout().buckets.size();
    if (guess) (void)zo.master_partition();  // built now, on the guess, which stays
    for (int step = 0; step < 2; ++step) {
      zo.begin_backward(true);
      zo.gather();
      loss().backward();
      zo.end_backward();
      zo.release();
      (guess ? row.guess : row.ready) = zo.buckets_issued_during_backward();
      zo.step(1.0);
    }
  }
  return row;
}

void print(const std::string& name, const Row& r) {
  std::cout << fmt::format("| {} | {} | {} | {} ({} after backward) | {} ({} after backward) |\n",
                           name, r.params, r.buckets, r.guess, r.buckets - r.guess, r.ready,
                           r.buckets - r.ready);
}

}  // namespace

int main(int argc, char** argv) {
  int buckets = 12;
  std::string configs = "model_zoo/configs";
  po::options_description opts("bucket_order");
  opts.add_options()("help", "this text")("buckets", po::value(&buckets), "buckets a model")(
      "configs", po::value(&configs), "the model configs' folder");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  at::set_num_threads(1);
  at::manual_seed(1);
  std::cout << "| model | parameters | buckets | issued during backward, first layout (reverse "
               "registration) | issued during backward, first-backward layout (ready order) |\n"
               "| --- | --- | --- | --- | --- |\n";
  const at::Tensor ids = at::randint(0, 128, {2, 17});
  const at::Tensor in = ids.slice(1, 0, 16), target = ids.slice(1, 1, 17);
  for (const char* file : {"gpt_tiny.json", "llama_tiny.json", "moe_tiny.yaml"}) {
    mz::GPTConfig cfg = mz::GPTConfig::from_file(configs + "/" + file);
    cfg.vocab_size = 128;  // else the embedding is most of a tiny model, and most of its buckets
    mz::GPT gpt(cfg);
    auto loss = [&] {
      dscpp::nn::AuxLossScope aux;  // the MoE blocks' balancing losses
      at::Tensor l = gpt->loss(gpt->forward(in), target);
      return aux.sum().defined() ? l + aux.sum() : l;
    };
    print(file, measure(*gpt, loss, buckets));
  }
  {
    mz::GPTConfig cfg = mz::GPTConfig::from_file(configs + "/gpt_tiny.json");
    cfg.vocab_size = 128;
    cfg.parallelism.tensor_model_parallel_size = 2;
    mz::TensorParallelGPT tp(cfg, dscpp::comm::make_no_op_group(0, 2));
    print("gpt_tiny.json, tensor parallel 2 (rank 0's half)",
          measure(
              *tp, [&] { return tp->loss(tp->forward(in), target); }, buckets));
  }
  ReversedMlp mlp;
  const at::Tensor x = at::randn({8, 64});
  print("six linears registered in reverse",
        measure(
            *mlp, [&] { return mlp->forward(x).square().sum(); }, buckets));
  return 0;
}
