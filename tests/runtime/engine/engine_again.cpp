// A second initialize in one process, on the ranks the launcher starts
// (tests/runtime/engine/CMakeLists.txt):
//  - a second engine while the first lives reuses the process group (the same object, no
//    second rendezvous on MASTER_PORT), and both train;
//  - both destroyed, a third engine is made and trains on: seeded as the first, it computes
//    the first's losses exactly, and its weights agree across the ranks;
//  - an init_distributed that does not fit the joined world (another backend, another
//    timeout) is a CommError saying what differs, and leaves the world usable.
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <iostream>
#include <vector>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"

using nlohmann::json;

namespace {

int failures = 0;
void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::cerr << "rank " << rank << ": FAILED: " << what << "\n";
    ++failures;
  }
}

json config() {
  return {{"train_batch_size", 4},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.05}}}}},
          {"zero_optimization", {{"stage", 2}}}};
}

// Trains `steps` steps on rank-dependent data; returns the losses, averaged over the ranks.
std::vector<double> train(dscpp::Engine<torch::nn::Linear>& engine, int steps) {
  std::vector<double> losses;
  const int rank = engine.global_rank();
  for (int s = 0; s < steps; ++s) {
    at::Tensor x = at::arange(8, at::kFloat).reshape({2, 4}) / (s + rank + 1.0);
    at::Tensor loss = engine.forward(x).square().mean();
    engine.backward(loss);
    engine.step();
    at::Tensor l = loss.detach().clone();
    engine.data_parallel_group().all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
    losses.push_back(l.item<double>());
  }
  return losses;
}

std::string error_of(const dscpp::comm::InitOptions& options) {
  try {
    dscpp::comm::init_distributed(options);
  } catch (const dscpp::comm::CommError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int main() try {
  int rank = 0;
  std::vector<double> first;
  dscpp::comm::ProcessGroup* first_group = nullptr;
  {
    torch::manual_seed(0);
    torch::nn::Linear a(4, 3);
    auto engine_a = dscpp::initialize(a, config());
    rank = engine_a.global_rank();
    first = train(engine_a, 3);
    first_group = &engine_a.data_parallel_group();

    // A second engine while the first lives: the same world, no second rendezvous.
    torch::manual_seed(1);
    torch::nn::Linear b(4, 3);
    auto engine_b = dscpp::initialize(b, config());
    check(&engine_b.data_parallel_group() == first_group,
          "the second initialize reuses the process group", rank);
    check(dscpp::comm::is_initialized(), "is_initialized after initialize", rank);
    const auto losses_b = train(engine_b, 2);
    check(losses_b.size() == 2 && losses_b[1] < losses_b[0], "the second engine trains", rank);
    train(engine_a, 1);  // the first still works beside it
  }
  // Both engines gone: a third, seeded as the first, trains as the first did.
  torch::manual_seed(0);
  torch::nn::Linear c(4, 3);
  auto engine_c = dscpp::initialize(c, config());
  check(&engine_c.data_parallel_group() == first_group,
        "after the engines are destroyed the world is still the process's", rank);
  const auto again = train(engine_c, 3);
  check(again == first, "the engine made again computes the first engine's losses exactly", rank);
  at::Tensor w = c->weight.detach().clone(), neg = -w;
  engine_c.data_parallel_group().all_reduce(w, dscpp::comm::ReduceOp::kMax).wait();
  engine_c.data_parallel_group().all_reduce(neg, dscpp::comm::ReduceOp::kMax).wait();
  check(at::equal(w, -neg), "the weights agree across ranks", rank);

  // What does not fit the world is refused with the reason, and the world goes on.
  dscpp::comm::InitOptions nccl;
  nccl.backend = "nccl";
  const std::string e1 = error_of(nccl);
  check(e1.find("already joined a world that does not fit this call (backend nccl was asked "
                "for, the world's is gloo)") != std::string::npos,
        "another backend is refused, naming both: " + e1, rank);
  dscpp::comm::InitOptions slow;
  slow.timeout = std::chrono::milliseconds(1234);
  const std::string e2 = error_of(slow);
  check(e2.find("a timeout of 1234 ms was asked for, the world's is 600000 ms") !=
                std::string::npos &&
            e2.find("destroy_process_group()") != std::string::npos,
        "another timeout is refused, naming both and the way out: " + e2, rank);
  check(train(engine_c, 1).size() == 1, "the world still works after the refusals", rank);
  if (failures == 0) std::cout << "engine_again: rank " << rank << " passed\n";
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "engine_again: " << e.what() << "\n";
  return 1;
}
