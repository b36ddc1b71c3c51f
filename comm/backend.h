// Internal: the c10d backend behind a ProcessGroup, and how to make one. Only comm's own
// .cpp files include this (it pulls in c10d's headers).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace dscpp::comm {

struct BackendHandle {
  c10::intrusive_ptr<c10d::Store> store;  // the group's store (prefixed per group)
  c10::intrusive_ptr<c10d::Backend> backend;
  std::string kind;                        // "gloo" or "nccl"
  bool native_avg = false;                 // the backend reduces with AVG itself
  int device_index = -1;                   // CUDA device for NCCL, -1 for CPU
  std::string master_addr;                 // how Gloo picks its network device
  std::optional<std::string> gloo_ifname;  // GLOO_SOCKET_IFNAME, read in launch_env.cpp
};

std::shared_ptr<BackendHandle> make_gloo_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int size, std::chrono::milliseconds timeout,
                                                 const std::string& master_addr,
                                                 const std::optional<std::string>& ifname);
// Throws CommError in a build without NCCL.
std::shared_ptr<BackendHandle> make_nccl_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int size, std::chrono::milliseconds timeout,
                                                 int device_index);

}  // namespace dscpp::comm
