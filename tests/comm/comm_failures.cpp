// A rank whose peers misbehave must fail with a CommError that names the op, the group,
// the rank and the time waited, never hang. Run by the launcher:
//   comm_failures timeout : 2 ranks; rank 1 never joins the all_reduce; rank 0 gives up
//                           after 2 s and names rank 1 as the one that did not arrive.
//   comm_failures dead    : 2 ranks; rank 1 exits at once; rank 0's all_reduce fails long
//                           before its 60 s timeout, because the peer's connection closed.
//   comm_failures stop S  : N ranks train (an all_reduce a step) with an S s timeout; the last
//                           rank SIGSTOPs itself at step 20; the others fail naming it.
//   comm_failures sum     : one all_reduce of ones; prints the world it saw (same-port jobs).
//   comm_failures env_timeout : prints the timeout init_distributed resolved (DEEPSPEED_TIMEOUT).
// In the failure modes a rank exits 3 when the failure was as expected.
#include <ATen/ATen.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "dscpp/comm/rendezvous.h"

namespace {

int stop_mode(double timeout_s) {
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto world = dscpp::comm::init_distributed(options);
  int last = world->size() - 1;
  for (int step = 0; step < 100000; ++step) {
    if (world->rank() == last && step == 20) {
      std::cout << "comm_failures: rank " << last << " stops itself at step 20" << std::endl;
      ::raise(SIGSTOP);
    }
    at::Tensor t = at::ones({64});
    auto start = std::chrono::steady_clock::now();
    try {
      world->all_reduce(t).wait();
    } catch (const dscpp::comm::CommError& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cout << "comm_failures: rank " << world->rank() << " caught at step " << step << ": "
                << e.what() << "\ncomm_failures: gave up after " << s << " s" << std::endl;
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[argc - 1] : "";
  if (argc > 2 && std::string(argv[argc - 2]) == "stop")
    return stop_mode(std::atof(argv[argc - 1]));
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  if (mode == "timeout") options.timeout = std::chrono::seconds(2);
  if (mode == "dead" || mode == "sum") options.timeout = std::chrono::seconds(60);
  auto world = dscpp::comm::init_distributed(options);
  if (mode == "env_timeout") {
    std::cout << "comm_failures: rank " << world->rank()
              << " timeout_ms=" << world->timeout().count() << std::endl;
    return 0;
  }
  if (mode == "sum") {
    at::Tensor t = at::ones({1});
    world->all_reduce(t).wait();
    std::cout << "comm_failures: rank " << world->rank() << " saw a world of " << world->size()
              << " summing to " << t.item<float>() << std::endl;
    return t.item<float>() == world->size() ? 0 : 1;
  }
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
