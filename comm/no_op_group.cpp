// make_no_op_group: a c10d backend whose collectives do only their local part.
#include "dscpp/comm/no_op_group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "dscpp/comm/backend.h"

namespace dscpp::comm {

namespace {

// A c10d Work that is complete from the start (finish() is protected in c10d::Work).
class DoneWork : public c10d::Work {
 public:
  DoneWork() { finish(); }
};

c10::intrusive_ptr<c10d::Work> done() {
  return c10::make_intrusive<DoneWork>();
}

// The slice of a flat buffer holding `parts` equal chunks that chunk `index` occupies.
at::Tensor chunk_of(const at::Tensor& flat, int64_t parts, int64_t index) {
  const int64_t n = flat.numel() / parts;
  return flat.reshape({-1}).slice(0, index * n, (index + 1) * n);
}

class NoOpBackend final : public c10d::Backend {
 public:
  NoOpBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "no-op"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&,
                                           const c10d::AllreduceOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&,
                                           const c10d::BroadcastOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions&) override {
    // The same tensor when the caller reduces in place (output is its own chunk of input).
    at::Tensor mine = chunk_of(input, getSize(), getRank());
    if (mine.data_ptr() != output.data_ptr()) output.reshape({-1}).copy_(mine);
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    at::Tensor place = chunk_of(output, getSize(), getRank());
    if (place.data_ptr() != input.data_ptr()) place.copy_(input.reshape({-1}));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    for (size_t i = 0; i < inputs.size(); ++i) outputs.at(i).at(getRank()).copy_(inputs[i]);
    return done();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    if (output_splits.empty()) {
      chunk_of(output, getSize(), getRank()).copy_(chunk_of(input, getSize(), getRank()));
      return done();
    }
    // Variable sizes: this rank's own rows (to itself) land in their place.
    auto offset = [&](const std::vector<int64_t>& splits) {
      int64_t o = 0;
      for (int k = 0; k < getRank(); ++k) o += splits[k];
      return o;
    };
    int64_t rows = std::min(output_splits[getRank()], input_splits[getRank()]);
    output.narrow(0, offset(output_splits), rows)
        .copy_(input.narrow(0, offset(input_splits), rows));
    return done();
  }
  // Point to point: nothing is sent, and a receive leaves its tensor as it was.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return done(); }
  void shutdown() override {}
};

std::shared_ptr<ProcessGroup> no_op_group(int rank, int size, const std::string& backend_name,
                                          std::string name, std::vector<int> ranks,
                                          std::chrono::milliseconds timeout) {
  auto handle = std::make_shared<BackendHandle>();
  handle->backend = c10::make_intrusive<NoOpBackend>(rank, size);
  handle->kind = backend_name;
  // An average of this rank's value alone is the value: no division after the no-op.
  handle->native_avg = true;
  return std::make_shared<ProcessGroup>(std::move(handle), std::move(name), std::move(ranks),
                                        timeout);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_no_op_group(int rank, int size,
                                               const std::string& backend_name) {
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError(fmt::format("make_no_op_group: rank {} of {} ranks", rank, size));
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return no_op_group(rank, size, backend_name, "no-op", std::move(ranks),
                     std::chrono::milliseconds(0));
}

std::shared_ptr<ProcessGroup> make_no_op_group(const ProcessGroup& like) {
  std::vector<int> ranks;
  for (int r = 0; r < like.size(); ++r) ranks.push_back(like.global_rank(r));
  return no_op_group(like.rank(), like.size(), like.backend_name(), like.name() + "/no-op",
                     std::move(ranks), like.timeout());
}

}  // namespace dscpp::comm
