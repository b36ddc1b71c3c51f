// A rank whose peers misbehave must fail with a CommError that names the op, the group,
// the rank and the time waited, never hang. Run by the launcher with 2 ranks:
//   comm_failures timeout : rank 1 never joins the all_reduce; rank 0 gives up after 2 s.
//   comm_failures dead    : rank 1 exits at once; rank 0's all_reduce fails long before its
//                           60 s timeout, because the peer's connection closed.
// Rank 0 prints what happened and exits 3 when the failure was as expected.
#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "dscpp/comm/rendezvous.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[argc - 1] : "";
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = mode == "timeout" ? std::chrono::seconds(2) : std::chrono::seconds(60);
  auto world = dscpp::comm::init_distributed(options);
  world->barrier().wait();
  if (world->rank() == 1) {
    if (mode == "timeout") std::this_thread::sleep_for(std::chrono::seconds(8));
    return 0;
  }
  at::Tensor t = at::ones({4});
  auto start = std::chrono::steady_clock::now();
  try {
    world->all_reduce(t).wait();
  } catch (const dscpp::comm::CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "comm_failures: caught: " << e.what() << "\n";
    std::cout << "comm_failures: gave up after " << s << " s\n";
    bool in_time = mode == "timeout" ? s < 10 : s < 30;
    if (in_time) std::cout << "comm_failures: failed as expected\n";
    return 3;
  }
  std::cout << "comm_failures: the all_reduce completed without its peer\n";
  return 1;
}
