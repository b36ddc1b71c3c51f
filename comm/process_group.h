// A group of ranks and its collectives: one small interface over LibTorch's c10d backends,
// Gloo for CPU tensors and NCCL for CUDA tensors. Every call returns a Work; wait() on it
// either completes or throws CommError naming the op, the group, the rank and the time
// waited (a collective past the group's timeout, or a peer that died, never hangs), and the
// ranks that did not arrive (each collective has a per-group sequence number, and every rank
// keeps a heartbeat in the group's store: arrival_monitor.h).
// On NCCL, wait() makes the caller's current CUDA stream wait on the collective's event;
// it does not block the host.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::comm {

class CommError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

enum class ReduceOp { kSum, kAvg, kMax, kMin };

class ProcessGroup;

// One send or receive of a batch (batch_isend_irecv): PyTorch's dist.P2POp.
struct P2POp {
  enum Kind { kSend, kRecv } kind;
  at::Tensor tensor;  // read (send) or written (recv) until the batch's Works complete
  int peer;           // group rank of the other side
  int tag = 0;
};

// An issued collective. Default-constructed: already complete.
class Work {
 public:
  Work() = default;
  // Waits for completion (or, on NCCL, orders the current stream after it); throws CommError.
  void wait();
  bool completed() const;
  // Whether this is an issued collective (a default-constructed Work is not).
  bool defined() const { return static_cast<bool>(state_); }

 private:
  friend class ProcessGroup;
  struct State;
  std::shared_ptr<State> state_;
};

// What a backend needs to exist: made by make_gloo_group / make_nccl_group.
struct BackendHandle;
class ArrivalMonitor;

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  ProcessGroup(std::shared_ptr<BackendHandle> backend, std::string name, std::vector<int> ranks,
               std::chrono::milliseconds timeout);
  ~ProcessGroup();

  int rank() const { return rank_; }  // this process's rank within the group
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::string& name() const { return name_; }
  const std::string& backend_name() const;
  // Global rank of group rank r.
  int global_rank(int r) const { return global_ranks_.at(r); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Many small tensors in one call where the backend can coalesce them.
  Work all_reduce_coalesced(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
  // input holds size() equal chunks; rank r receives the reduction of chunk r in output.
  Work reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::kSum);
  // output holds size() chunks of input's size: chunk r is rank r's input.
  Work all_gather(at::Tensor& output, const at::Tensor& input);
  Work all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input);
  Work broadcast(at::Tensor& tensor, int src);
  Work send(at::Tensor& tensor, int dst, int tag = 0);
  Work recv(at::Tensor& tensor, int src, int tag = 0);
  // Several sends and receives issued together (PyTorch's batch_isend_irecv): on NCCL as one
  // group (startCoalescing / endCoalescing: one Work for all), so that no order of the
  // paired sends and receives between two ranks can deadlock; on Gloo, whose sends and
  // receives never block the caller, issued in order (one Work each). Each side must list
  // the transfers between a pair of ranks in the same order.
  std::vector<Work> batch_isend_irecv(std::vector<P2POp>& ops);
  // input and output hold size() equal chunks; chunk j of rank i goes to chunk i of rank j.
  Work all_to_all(at::Tensor& output, const at::Tensor& input);
  // Variable sizes (PyTorch's all_to_all_single with split sizes), along dim 0: rows
  // [offset_j, offset_j + input_splits[j]) of input go to rank j; output holds, in rank order,
  // output_splits[i] rows from rank i. Rank i's input_splits[j] must equal rank j's
  // output_splits[i] (exchange the counts first); splits may be zero. Each list has size()
  // entries summing to its tensor's first dimension (a CommError otherwise).
  Work all_to_all(at::Tensor& output, const at::Tensor& input,
                  const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits);
  Work barrier();

  // What this process has issued on this group so far, per op name ("all_reduce",
  // "all_gather", ...): calls, and the elements this rank contributed (the input's numel for
  // all_reduce, reduce_scatter and all_gather; 0 for the others). For tests and profiles
  // that assert which collectives a computation runs (a vocabulary-parallel loss that never
  // gathers its logits); ops never issued read as zero.
  struct IssuedCount {
    int64_t calls = 0;
    int64_t elements = 0;
  };
  IssuedCount issued(const std::string& op) const;

  // A sub-group of the given ranks of this group (ascending, distinct). Every rank of this
  // group must call it, in the same order; ranks outside the list get nullptr.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks,
                                             const std::string& name = "");

 private:
  Work issue(const char* op, std::function<void(Work&)> start);

  std::shared_ptr<BackendHandle> backend_;
  std::string name_;
  std::vector<int> global_ranks_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_;
  int subgroups_made_ = 0;                   // names sub-group stores identically on every rank
  std::shared_ptr<ArrivalMonitor> monitor_;  // null for a backend without a store
  std::map<std::string, IssuedCount> issued_;
};

}  // namespace dscpp::comm
