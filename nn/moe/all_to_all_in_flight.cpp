// The all-to-all in flight: see all_to_all_in_flight.h.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/moe/all_to_all_in_flight.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <utility>

#include "dscpp/error.h"

namespace dscpp::nn::moe {

struct AllToAllInFlight::State : torch::CustomClassHolder {
  std::shared_ptr<comm::ProcessGroup> group;
  std::vector<int64_t> out_splits, in_splits;  // empty: equal chunks
  comm::Work forward;                          // start's exchange, until wait()
  comm::Work backward;                         // the gradient's, from wait's to start's backward
  at::Tensor backward_landing;                 // where the gradient's exchange writes
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using StatePtr = c10::intrusive_ptr<AllToAllInFlight::State>;

// Issues x's exchange into a new tensor (returned in `out`).
comm::Work issue(const at::Tensor& x, at::Tensor& out, const std::vector<int64_t>& out_splits,
                 const std::vector<int64_t>& in_splits, comm::ProcessGroup& group) {
  const at::Tensor in = x.contiguous();
  auto sizes = in.sizes().vec();
  if (!out_splits.empty()) {
    sizes[0] = 0;
    for (int64_t s : out_splits) sizes[0] += s;
  }
  out = at::empty(sizes, in.options());
  return out_splits.empty() ? group.all_to_all(out, in)
                            : group.all_to_all(out, in, out_splits, in_splits);
}

void keep(AutogradContext* ctx, const StatePtr& state) {
  ctx->saved_data["state"] = at::IValue::make_capsule(state);
}

StatePtr kept(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<AllToAllInFlight::State>(
      ctx->saved_data["state"].toCapsule());
}

class StartExchange : public torch::autograd::Function<StartExchange> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const StatePtr& state) {
    keep(ctx, state);
    at::Tensor out;
    state->forward = issue(x, out, state->out_splits, state->in_splits, *state->group);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const StatePtr state = kept(ctx);
    at::Tensor dx;
    if (state->backward.defined()) {
      // Issued by wait's backward: the nodes between ran while it was on the wire.
      state->backward.wait();
      dx = std::move(state->backward_landing);
    } else {
      // start's output reached the loss without wait (not by this class's use): blocking.
      issue(grads[0], dx, state->in_splits, state->out_splits, *state->group).wait();
    }
    state->backward = {};
    state->backward_landing = at::Tensor();
    return {dx, at::Tensor()};
  }
};

class WaitExchange : public torch::autograd::Function<WaitExchange> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& landing,
                            const StatePtr& state) {
    keep(ctx, state);
    state->forward.wait();
    state->forward = {};
    return landing;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const StatePtr state = kept(ctx);
    // The gradient goes back the way the rows came (the splits swap roles). The incoming
    // gradient passes on to start's backward only as the dependency that orders it: start's
    // output has no other use, and start returns what this exchange brings.
    state->backward = issue(grads[0], state->backward_landing, state->in_splits, state->out_splits,
                            *state->group);
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

AllToAllInFlight::AllToAllInFlight() = default;
AllToAllInFlight::~AllToAllInFlight() = default;
AllToAllInFlight::AllToAllInFlight(AllToAllInFlight&&) noexcept = default;
AllToAllInFlight& AllToAllInFlight::operator=(AllToAllInFlight&&) noexcept = default;

AllToAllInFlight AllToAllInFlight::start(const at::Tensor& x,
                                         const std::shared_ptr<comm::ProcessGroup>& group,
                                         const std::vector<int64_t>& output_splits,
                                         const std::vector<int64_t>& input_splits) {
  AllToAllInFlight flight;
  if (!group || group->size() == 1) {
    flight.passed_ = x;
    return flight;
  }
  if (output_splits.empty() != input_splits.empty())
    throw dscpp::Error("AllToAllInFlight: give both split lists or neither");
  flight.state_ = c10::make_intrusive<State>();
  flight.state_->group = group;
  flight.state_->out_splits = output_splits;
  flight.state_->in_splits = input_splits;
  flight.landing_ = StartExchange::apply(x, flight.state_);
  return flight;
}

at::Tensor AllToAllInFlight::wait() {
  if (passed_.defined()) return std::exchange(passed_, at::Tensor());
  if (!state_) throw dscpp::Error("AllToAllInFlight::wait without a pending start");
  at::Tensor out = WaitExchange::apply(landing_, state_);
  landing_ = at::Tensor();
  state_.reset();
  return out;
}

}  // namespace dscpp::nn::moe
