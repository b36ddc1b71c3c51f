// linear_with_async_communication: one autograd function (with a bias and without) whose
// backward issues its collectives without waiting and waits only where the data is needed.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/linear_async_communication.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include "dscpp/nn/autograd_group.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/tp_comm_overlap.h"
#include "dscpp/ops/deferred_grads.h"
#include "dscpp/ops/grad_destination.h"

namespace dscpp::nn {

namespace {

using detail::GroupHolderPtr;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<std::string>* trace_sink = nullptr;

void trace(const char* step) {
  if (trace_sink) trace_sink->emplace_back(step);
}

// The ranks' shards concatenated along dim 0 (written there by all_gather); not waited for.
at::Tensor gather_first_async(const at::Tensor& x, comm::ProcessGroup& g, comm::Work& work) {
  auto sizes = x.sizes().vec();
  sizes[0] *= g.size();
  at::Tensor out = at::empty(sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  work = g.all_gather(out, x.contiguous());
  return out;
}

// As nn::linear's forward: the same products, so the same bits.
at::Tensor linear_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor out = bias.defined() ? at::addmm(bias, x2, weight.t()) : at::mm(x2, weight.t());
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return out.view(sizes);
}

// Sequence parallel: the all-gather of piece j+1 of the shard is issued before the product of
// piece j runs (tp_comm_overlap.h); one piece: gather, then the one product, as before.
at::Tensor gather_and_product(const at::Tensor& x_in, const at::Tensor& weight,
                              const at::Tensor& bias, comm::ProcessGroup& g, int64_t num_splits) {
  const at::Tensor x = x_in.contiguous();
  const int64_t t = g.size();
  const int64_t rows = x.size(0);
  auto out_sizes = x.sizes().vec();
  out_sizes[0] = rows * t;
  out_sizes.back() = weight.size(0);
  const auto pieces = tp_comm_overlap_pieces(rows, num_splits);
  if (pieces.size() == 1) {
    comm::Work work;
    at::Tensor total = gather_first_async(x, g, work);
    work.wait();
    // As nn::linear records it, for the flops profiler: the gathered input, the parameter.
    RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({total, weight, bias}));
    return linear_product(total, weight, bias);
  }
  at::Tensor out = at::empty(out_sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  // [t, s/t, ..., out/t]: rank r's rows of the gathered sequence are out_ranks[r].
  auto v = out_sizes;
  v[0] = rows;
  v.insert(v.begin(), t);
  at::Tensor out_ranks = out.view(v);
  std::vector<at::Tensor> gathered(pieces.size());
  std::vector<comm::Work> works(pieces.size());
  auto issue = [&](size_t j) {
    gathered[j] = gather_first_async(x.narrow(0, pieces[j].first, pieces[j].second), g, works[j]);
    trace("issue all_gather piece");
  };
  issue(0);
  for (size_t j = 0; j < pieces.size(); ++j) {
    if (j + 1 < pieces.size()) issue(j + 1);
    works[j].wait();
    trace("wait all_gather piece");
    RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({gathered[j], weight, bias}));
    at::Tensor y = linear_product(gathered[j], weight, bias);  // [t·len, ..., out/t], rank-major
    auto yv = y.sizes().vec();
    yv[0] = pieces[j].second;
    yv.insert(yv.begin(), t);
    out_ranks.narrow(1, pieces[j].first, pieces[j].second).copy_(y.view(yv));
    trace("product piece");
    gathered[j] = at::Tensor();  // the gathered piece is not held past its product
  }
  return out;
}

at::Tensor forward_impl(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias, const GroupHolderPtr& holder,
                        bool sequence_parallel, int64_t num_splits) {
  detail::save_group(ctx, holder);
  ctx->saved_data["sequence_parallel"] = sequence_parallel;
  // Only the shard is saved under sequence parallelism: backward gathers it again.
  ctx->save_for_backward({x, weight});
  if (sequence_parallel) return gather_and_product(x, weight, bias, *holder->group, num_splits);
  RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({x, weight, bias}));
  return linear_product(x, weight, bias);
}

variable_list backward_impl(AutogradContext* ctx, const at::Tensor& grad, bool with_bias) {
  variable_list out(with_bias ? 6 : 5);
  if (!grad.defined()) return out;
  auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& weight = saved[1];
  comm::ProcessGroup& g = *detail::saved_group(ctx);
  const bool sp = ctx->saved_data["sequence_parallel"].toBool();
  const bool need_input = ctx->needs_input_grad(0);
  const bool need_weight = ctx->needs_input_grad(1);
  const at::Tensor g2 = grad.reshape({-1, grad.size(-1)});

  // The input's all-gather runs while grad_input is computed (it does not need X).
  comm::Work gather;
  at::Tensor total = x;
  if (sp && need_weight) {
    total = gather_first_async(x, g, gather);
    trace("issue all_gather");
  }
  at::Tensor grad_input;
  if (need_input) {
    auto sizes = x.sizes().vec();
    if (sp) sizes[0] *= g.size();
    grad_input = at::mm(g2, weight).view(sizes);
    trace("grad_input");
  }
  if (gather.defined()) {
    gather.wait();
    trace("wait all_gather");
  }
  // grad_input's reduction runs while grad_weight is computed.
  comm::Work reduce;
  const char* reduce_wait = nullptr;
  if (need_input) {
    if (sp) {
      at::Tensor shard =
          at::empty(x.sizes(), grad_input.options().memory_format(at::MemoryFormat::Contiguous));
      reduce = g.reduce_scatter(shard, grad_input.contiguous());
      grad_input = shard;
      trace("issue reduce_scatter");
      reduce_wait = "wait reduce_scatter";
    } else {
      grad_input = grad_input.contiguous();
      reduce = g.all_reduce(grad_input);
      trace("issue all_reduce");
      reduce_wait = "wait all_reduce";
    }
  }
  if (need_weight) {
    // Put off to W inside a split backward (ops/deferred_grads.h), holding the gathered input.
    auto product = [weight, gt = g2.t(), t2 = total.reshape({-1, total.size(-1)})] {
      return ops::write_weight_grad(weight, gt, t2) ? at::Tensor() : at::mm(gt, t2);
    };
    if (!ops::defer_weight_grad(weight, product)) out[1] = product();
    trace("grad_weight");
  }
  if (with_bias && ctx->needs_input_grad(2)) {
    out[2] = g2.sum(0);
    trace("grad_bias");
  }
  if (reduce.defined()) {
    reduce.wait();
    trace(reduce_wait);
  }
  out[0] = grad_input;
  return out;
}

// Autograd takes no undefined tensor as an input, hence one function with a bias and one without.
struct AsyncLinearWithBias : torch::autograd::Function<AsyncLinearWithBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, GroupHolderPtr holder, bool sequence_parallel,
                            int64_t num_splits) {
    return forward_impl(ctx, x, weight, bias, holder, sequence_parallel, num_splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_impl(ctx, grads[0], true);
  }
};

struct AsyncLinearNoBias : torch::autograd::Function<AsyncLinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            GroupHolderPtr holder, bool sequence_parallel, int64_t num_splits) {
    return forward_impl(ctx, x, weight, at::Tensor(), holder, sequence_parallel, num_splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_impl(ctx, grads[0], false);
  }
};

}  // namespace

at::Tensor linear_with_async_communication(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& bias, const GroupPtr& group,
                                           bool sequence_parallel, int64_t num_splits) {
  tp_comm_overlap_pieces(1, num_splits);  // the check of num_splits, whatever the group
  if (tensor_model_parallel_size(group) == 1) return nn::linear(x, weight, bias);
  auto holder = detail::hold_group(group);
  return bias.defined()
             ? AsyncLinearWithBias::apply(x, weight, bias, holder, sequence_parallel, num_splits)
             : AsyncLinearNoBias::apply(x, weight, holder, sequence_parallel, num_splits);
}

void set_async_communication_trace(std::vector<std::string>* trace) {
  trace_sink = trace;
}

}  // namespace dscpp::nn
