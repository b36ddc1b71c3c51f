// dist_check: the seed's distributed check. Every rank joins the job the launcher started
// (comm::init_distributed: the TCPStore at MASTER_ADDR:MASTER_PORT, Gloo on the CPU, NCCL on a
// GPU), all-reduces its own rank, and rank 0 prints the sum beside the formula it must equal:
//
//   dscpp --num_gpus=8 build/examples/dist_check
//   dist_check: 0+1+...+7 = 28 (8 ranks, gloo): ok
//
// Exit status 0 when the sum is n(n-1)/2 on every rank, 1 when not (each rank checks the sum it
// received, so a rank that got a wrong one says so), 2 when the job cannot be joined.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <iostream>

#include "dscpp/comm/error_text.h"
#include "dscpp/comm/rendezvous.h"

int main() {
  std::shared_ptr<dscpp::comm::ProcessGroup> world;
  try {
    world = dscpp::comm::init_distributed();
  } catch (const std::exception& e) {
    std::cerr << "dist_check: cannot join the job: " << dscpp::comm::error_text(e) << "\n";
    return 2;
  }
  const int rank = world->rank(), n = world->size();
  // On a GPU the tensor lives there, so that NCCL is what is checked.
  at::Device device = world->backend_name() == "nccl"
                          ? at::Device(at::kCUDA, dscpp::comm::read_dist_env().local_rank)
                          : at::Device(at::kCPU);
  at::Tensor t =
      at::full({1}, static_cast<double>(rank), at::TensorOptions(at::kDouble).device(device));
  try {
    world->all_reduce(t).wait();
  } catch (const std::exception& e) {
    std::cerr << "dist_check: rank " << rank
              << ": all_reduce failed: " << dscpp::comm::error_text(e) << "\n";
    return 1;
  }
  const auto sum = static_cast<int64_t>(t.cpu().item<double>());
  const int64_t expected = static_cast<int64_t>(n) * (n - 1) / 2;
  // The seed's way of writing the sum: 0+1+...+7 (every term while there are three or fewer).
  std::string terms = n <= 3 ? "0" : fmt::format("0+1+...+{}", n - 1);
  for (int r = 1; n <= 3 && r < n; ++r) terms += "+" + std::to_string(r);
  if (sum != expected) {
    std::cerr << fmt::format("dist_check: rank {}: {} = {}, but the all-reduce gave {}\n", rank,
                             terms, expected, sum);
    return 1;
  }
  if (rank == 0)
    std::cout << fmt::format("dist_check: {} = {} ({} ranks, {}): ok\n", terms, sum, n,
                             world->backend_name())
              << std::flush;
  dscpp::comm::destroy_process_group();
  return 0;
}
