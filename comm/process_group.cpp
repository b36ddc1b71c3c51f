// ProcessGroup over a c10d backend: argument checks, op translation, and errors that say
// which collective failed where.
#include "dscpp/comm/process_group.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "dscpp/comm/arrival_monitor.h"
#include "dscpp/comm/backend.h"
#include "dscpp/comm/error_text.h"

namespace dscpp::comm {

namespace {

// AVG stays AVG only where the backend averages itself; elsewhere it is a SUM followed by
// a local division when the Work completes.
c10d::ReduceOp to_c10d(ReduceOp op, bool native_avg) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kAvg:
      return native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep_alive;  // tensors the backend reads or writes until done
  std::function<void()> after;         // local finishing step (the division of an average)
  std::string what;                    // "all_reduce on group 'world' (rank 1 of 4)"
  std::chrono::steady_clock::time_point start;
  bool done = false;
  std::shared_ptr<ArrivalMonitor> monitor;  // names the silent ranks when the wait fails
  uint64_t seq = 0;                         // this collective's number in its group
};

void Work::wait() {
  if (!state_ || state_->done) return;
  try {
    state_->work->wait();
  } catch (const std::exception& e) {
    double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - state_->start).count();
    state_->done = true;
    std::string who = state_->monitor ? state_->monitor->diagnose(state_->seq) + "; " : "";
    throw CommError(fmt::format("{} failed after {:.1f} s: {}backend: {}", state_->what, waited,
                                who, error_text(e)));
  }
  if (state_->after) state_->after();
  state_->keep_alive.clear();
  state_->done = true;
}

bool Work::completed() const {
  return !state_ || state_->done || state_->work->isCompleted();
}

ProcessGroup::ProcessGroup(std::shared_ptr<BackendHandle> backend, std::string name,
                           std::vector<int> ranks, std::chrono::milliseconds timeout)
    : backend_(std::move(backend)),
      name_(std::move(name)),
      global_ranks_(std::move(ranks)),
      rank_(backend_->backend->getRank()),
      timeout_(timeout) {
  if (backend_->store)
    monitor_ = std::make_shared<ArrivalMonitor>(backend_->store, name_, rank_, global_ranks_,
                                                timeout_, backend_->kind == "nccl");
}

ProcessGroup::~ProcessGroup() {
  // NCCL's communicators are torn down explicitly (as destroy_process_group does in
  // Python), so that no rank leaves them to the process's exit.
  if (backend_ && backend_->kind == "nccl") {
    try {
      backend_->backend->shutdown();
    } catch (const std::exception&) {
      // a failed job is already reporting its error; nothing more to say here
    }
  }
}

const std::string& ProcessGroup::backend_name() const {
  return backend_->kind;
}

ProcessGroup::IssuedCount ProcessGroup::issued(const std::string& op) const {
  auto it = issued_.find(op);
  return it == issued_.end() ? IssuedCount{} : it->second;
}

Work ProcessGroup::issue(const char* op, std::function<void(Work&)> start) {
  ++issued_[op].calls;
  Work w;
  w.state_ = std::make_shared<Work::State>();
  w.state_->what =
      fmt::format("{} on group '{}' (rank {} of {}, {})", op, name_, rank_, size(), backend_->kind);
  w.state_->start = std::chrono::steady_clock::now();
  if (monitor_) {
    w.state_->monitor = monitor_;
    w.state_->seq = monitor_->arrive(op);
  }
  try {
    start(w);
    if (monitor_ && w.state_->work) monitor_->track(w.state_->work, w.state_->seq, op);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} could not start: {}", w.state_->what, e.what()));
  }
  return w;
}

Work ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  return all_reduce_coalesced(tensors, op);
}

Work ProcessGroup::all_reduce_coalesced(std::vector<at::Tensor>& tensors, ReduceOp op) {
  for (const auto& t : tensors) issued_["all_reduce"].elements += t.numel();
  return issue("all_reduce", [&](Work& w) {
    bool local_avg = op == ReduceOp::kAvg && !backend_->native_avg;
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op, backend_->native_avg);
    opts.timeout = timeout_;
    w.state_->keep_alive = tensors;
    if (tensors.size() == 1) {
      w.state_->work = backend_->backend->allreduce(w.state_->keep_alive, opts);
    } else {
      c10d::AllreduceCoalescedOptions copts;
      copts.reduceOp = opts.reduceOp;
      copts.timeout = timeout_;
      w.state_->work = backend_->backend->allreduce_coalesced(w.state_->keep_alive, copts);
    }
    if (local_avg) {
      auto kept = tensors;
      int n = size();
      w.state_->after = [kept, n]() mutable {
        for (auto& t : kept) t.div_(n);
      };
    }
  });
}

Work ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  if (input.numel() != output.numel() * size())
    throw CommError(
        fmt::format("reduce_scatter on group '{}': input has {} elements, expected "
                    "{} (output {} x {} ranks)",
                    name_, input.numel(), output.numel() * size(), output.numel(), size()));
  issued_["reduce_scatter"].elements += input.numel();
  return issue("reduce_scatter", [&](Work& w) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op, backend_->native_avg);
    opts.timeout = timeout_;
    // The input is not kept here: both backends hold it until the collective has run
    // (Gloo's work object; NCCL's record-stream or stash), and ZeRO frees a bucket's
    // gradients by dropping it as soon as its reduce-scatter is issued.
    at::Tensor in = input.contiguous();
    w.state_->keep_alive = {output};
    w.state_->work = backend_->backend->_reduce_scatter_base(output, in, opts);
    if (op == ReduceOp::kAvg && !backend_->native_avg) {
      at::Tensor out = output;
      int n = size();
      w.state_->after = [out, n]() mutable { out.div_(n); };
    }
  });
}

Work ProcessGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  if (output.numel() != input.numel() * size())
    throw CommError(fmt::format("all_gather on group '{}': output has {} elements, expected {}",
                                name_, output.numel(), input.numel() * size()));
  issued_["all_gather"].elements += input.numel();
  return issue("all_gather", [&](Work& w) {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    at::Tensor in = input.contiguous();
    w.state_->keep_alive = {output, in};
    w.state_->work = backend_->backend->_allgather_base(output, in, opts);
  });
}

Work ProcessGroup::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  if (static_cast<int>(outputs.size()) != size())
    throw CommError(fmt::format("all_gather on group '{}': {} outputs for {} ranks", name_,
                                outputs.size(), size()));
  issued_["all_gather"].elements += input.numel();
  return issue("all_gather", [&](Work& w) {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    std::vector<std::vector<at::Tensor>> outs{outputs};
    std::vector<at::Tensor> ins{input.contiguous()};
    w.state_->keep_alive = outputs;
    w.state_->keep_alive.push_back(ins[0]);
    w.state_->work = backend_->backend->allgather(outs, ins, opts);
  });
}

Work ProcessGroup::broadcast(at::Tensor& tensor, int src) {
  return issue("broadcast", [&](Work& w) {
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    opts.timeout = timeout_;
    w.state_->keep_alive = {tensor};
    w.state_->work = backend_->backend->broadcast(w.state_->keep_alive, opts);
  });
}

Work ProcessGroup::send(at::Tensor& tensor, int dst, int tag) {
  return issue("send", [&](Work& w) {
    w.state_->keep_alive = {tensor};
    w.state_->work = backend_->backend->send(w.state_->keep_alive, dst, tag);
  });
}

Work ProcessGroup::recv(at::Tensor& tensor, int src, int tag) {
  return issue("recv", [&](Work& w) {
    w.state_->keep_alive = {tensor};
    w.state_->work = backend_->backend->recv(w.state_->keep_alive, src, tag);
  });
}

std::vector<Work> ProcessGroup::batch_isend_irecv(std::vector<P2POp>& ops) {
  for (const auto& op : ops)
    if (op.peer < 0 || op.peer >= size() || op.peer == rank_)
      throw CommError(
          fmt::format("batch_isend_irecv on group '{}' (rank {} of {}): peer {} is "
                      "not another rank of the group",
                      name_, rank_, size(), op.peer));
  std::vector<Work> works;
  if (ops.empty()) return works;
  if (!backend_->backend->supportsCoalescing()) {  // Gloo: in order, none of them blocks
    for (auto& op : ops)
      works.push_back(op.kind == P2POp::kSend ? send(op.tensor, op.peer, op.tag)
                                              : recv(op.tensor, op.peer, op.tag));
    return works;
  }
  works.push_back(issue("batch_isend_irecv", [&](Work& w) {
    // One NCCL group: every op goes into it, and the group's one Work completes them all.
    backend_->backend->startCoalescing();
    try {
      for (auto& op : ops) {
        std::vector<at::Tensor> one{op.tensor};
        if (op.kind == P2POp::kSend)
          (void)backend_->backend->send(one, op.peer, op.tag);
        else
          (void)backend_->backend->recv(one, op.peer, op.tag);
        w.state_->keep_alive.push_back(op.tensor);
      }
    } catch (...) {
      (void)backend_->backend->endCoalescing();  // leave the backend out of coalescing mode
      throw;
    }
    w.state_->work = backend_->backend->endCoalescing();
  }));
  return works;
}

Work ProcessGroup::all_to_all(at::Tensor& output, const at::Tensor& input) {
  if (input.numel() != output.numel() || input.size(0) % size() != 0)
    throw CommError(
        fmt::format("all_to_all on group '{}': input and output must have equal "
                    "sizes with a first dimension divisible by {}",
                    name_, size()));
  return issue("all_to_all", [&](Work& w) {
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    at::Tensor in = input.contiguous();
    w.state_->keep_alive = {output, in};
    std::vector<int64_t> even;  // empty split sizes: equal chunks
    w.state_->work = backend_->backend->alltoall_base(output, in, even, even, opts);
  });
}

Work ProcessGroup::all_to_all(at::Tensor& output, const at::Tensor& input,
                              const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits) {
  auto check = [&](const char* which, const at::Tensor& t, const std::vector<int64_t>& splits) {
    int64_t sum = 0;
    bool negative = false;
    for (int64_t s : splits) {
      sum += s;
      negative = negative || s < 0;
    }
    if (static_cast<int>(splits.size()) != size() || negative || t.dim() == 0 || sum != t.size(0))
      throw CommError(fmt::format(
          "all_to_all on group '{}' (rank {} of {}): {} splits [{}] must be {} sizes >= 0 "
          "summing to the {}'s first dimension ({})",
          name_, rank_, size(), which, fmt::join(splits, ", "), size(), which,
          t.dim() == 0 ? 0 : t.size(0)));
  };
  check("output", output, output_splits);
  check("input", input, input_splits);
  if (output.dim() != input.dim() || output.sizes().slice(1) != input.sizes().slice(1) ||
      output.scalar_type() != input.scalar_type())
    throw CommError(
        fmt::format("all_to_all on group '{}': input and output must have the same dtype and "
                    "the same sizes after the first dimension",
                    name_));
  if (!output.is_contiguous())
    throw CommError(fmt::format("all_to_all on group '{}': the output must be contiguous", name_));
  return issue("all_to_all", [&](Work& w) {
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    at::Tensor in = input.contiguous();
    w.state_->keep_alive = {output, in};
    std::vector<int64_t> out_splits = output_splits, in_splits = input_splits;
    w.state_->work = backend_->backend->alltoall_base(output, in, out_splits, in_splits, opts);
  });
}

Work ProcessGroup::barrier() {
  return issue("barrier", [&](Work& w) {
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    if (backend_->device_index >= 0) opts.device_ids = {backend_->device_index};
    w.state_->work = backend_->backend->barrier(opts);
  });
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_subgroup(const std::vector<int>& ranks,
                                                         const std::string& name) {
  if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= size())
    throw CommError(
        fmt::format("new_subgroup of group '{}': ranks must be ascending, distinct and "
                    "within [0, {})",
                    name_, size()));
  int id = subgroups_made_++;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::string sub_name = name.empty() ? fmt::format("{}/sub{}", name_, id) : name;
  auto store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("sub{}/", id), backend_->store);
  int sub_rank = static_cast<int>(it - ranks.begin());
  int sub_size = static_cast<int>(ranks.size());
  std::shared_ptr<BackendHandle> handle =
      backend_->kind == "nccl"
          ? make_nccl_backend(store, sub_rank, sub_size, timeout_, backend_->device_index)
          : make_gloo_backend(store, sub_rank, sub_size, timeout_, backend_->master_addr,
                              backend_->gloo_ifname);
  std::vector<int> globals;
  for (int r : ranks) globals.push_back(global_ranks_[r]);
  return std::make_shared<ProcessGroup>(handle, sub_name, globals, timeout_);
}

}  // namespace dscpp::comm
