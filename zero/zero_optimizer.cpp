// ZeroOptimizer: see zero_optimizer.h.
#include "dscpp/zero/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "dscpp/error.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/ops/grad_destination.h"
#include "dscpp/zero/grad_hooks.h"
#include "dscpp/zero/step_scale.h"

namespace dscpp::zero {

ZeroOptimizer::ZeroOptimizer(std::vector<at::Tensor> params,
                             std::unique_ptr<optim::Optimizer> optimizer,
                             std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options)
    : options_(options), group_(std::move(group)) {
  for (const auto& p : params) shapes_.push_back(p.sizes().vec());
  whole_params_ = optimizer && optimizer->needs_whole_params();
  if (whole_params_ && options_.offload.enabled &&
      (options_.offload.nvme.enabled || options_.offload.ratio < 1.0))
    throw Error("ZeroOptimizer: optimizer '" + optimizer->name() +
                "' updates each parameter whole, which the optimizer's NVMe offload and a "
                "partial offload (ratio < 1), stepping the partition a piece at a time, do not "
                "do: offload it to the CPU whole (offload_optimizer.device \"cpu\", ratio 1)");
  layout_ = lay_out({});
  const auto opts = params.empty() ? at::TensorOptions().dtype(at::kFloat) : params[0].options();
  if (options_.grad_dtype != at::kFloat && options_.grad_dtype != opts.dtype().toScalarType())
    throw Error(
        "ZeroOptimizer: a 16-bit gradient partition must be of the "
        "parameters' type");

  if (options_.offload_param.enabled && options_.stage != 3)
    throw Error("ZeroOptimizer: offloading the parameters needs ZeRO stage 3");
  if (options_.offload.enabled && options_.stage < 1)
    throw Error("ZeroOptimizer: offloading the optimizer needs ZeRO stage 1, 2 or 3");
  if (options_.offload.enabled && options_.offload.ratio < 1.0 && options_.stage != 3)
    throw Error("ZeroOptimizer: partial offload (ratio < 1) needs ZeRO stage 3");
  store_ = std::make_unique<ParamStore>(params, layout_, group_, options_.offload_param);
  pending_optimizer_ = std::move(optimizer);
  param_options_ = opts;
  // Layouts by layer keep their order, and stage 3 its partition (see the header).
  const bool final_now = params.empty() || !options_.unit_of.empty() || options_.defer_allgather ||
                         options_.stage >= 3;
  first_seen_.assign(params.size(), 0);
  if (options_.offload.enabled && options_.offload.host_gradients)
    first_parked_.resize(params.size());
  hooks_ = register_ready_hooks(params, [this](int i) {
    if (buckets_) return buckets_->mark_ready(i);
    if (!first_seen_[i]) {
      first_seen_[i] = 1;
      first_order_.push_back(i);
    }
    if (first_parked_.empty()) return;
    // (a gradient accumulated twice in one backward, as reentrant checkpointing can, adds up)
    at::NoGradGuard no_grad;
    at::Tensor& grad = store_->params()[i].mutable_grad();
    if (!grad.defined()) return;
    at::Tensor& parked = first_parked_[i];
    parked = parked.defined() ? parked.add_(grad.to(at::kCPU)) : grad.to(at::kCPU);
    grad.reset();
  });
  if (final_now) build({});
}

void ZeroOptimizer::build_in_order(const std::vector<int>& order) {
  if (master_) return;
  std::vector<char> seen(shapes_.size(), 0);
  for (int i : order) {
    if (i < 0 || i >= static_cast<int>(seen.size()) || seen[i])
      throw Error("ZeroOptimizer: a layout order must name every parameter once");
    seen[i] = 1;
  }
  if (order.size() != seen.size())
    throw Error("ZeroOptimizer: a layout order of " + std::to_string(order.size()) +
                " parameters for " + std::to_string(seen.size()));
  build(order);
}

void ZeroOptimizer::build(const std::vector<int>& order) {
  at::NoGradGuard no_grad;
  layout_order_ = order;
  if (!order.empty()) {
    FlatLayout fresh = lay_out(order);
    if (!fresh.same_placement(layout_)) {
      const FlatLayout old = layout_;
      layout_ = std::move(fresh);
      store_->relayout(old);
    }
  }
  const at::TensorOptions opts = param_options_;
  // The master partition and the gradient partition are allocated while the
  // whole 16-bit model is still held (stage 3 releases it below): after that
  // release they would be carved out of the released buffer's segment, and the
  // rest of that segment (16 GiB at 17 B parameters) could then hold neither
  // Adam moment nor return to the device.
  master_ = std::make_unique<MasterPartition>(
      layout_, opts, std::move(pending_optimizer_), options_.grad_dtype, options_.offload.enabled,
      HostShare{options_.offload.ratio, options_.offload.sub_group_size},
      options_.offload.nvme.enabled ? &options_.offload.nvme : nullptr,
      options_.offload.enabled && options_.offload.host_gradients,
      options_.offload.pin_memory && !opts.device().is_cpu());
  if (options_.offload.enabled)
    offload_ = std::make_unique<OffloadStepper>(layout_, opts.device(), options_.grad_dtype,
                                                opts.dtype().toScalarType(), options_.offload);
  // (an update of whole matrices on the host computes them where training runs)
  if (whole_params_ && options_.offload.enabled)
    master_->optimizer().set_compute_device(opts.device());
  refresh_master_from_params();

  ReduceOptions ro;
  ro.scatter = options_.stage >= 1;
  ro.overlap_comm = options_.overlap_comm;
  ro.use_reduce_scatter = options_.reduce_scatter;
  ro.prescale_gradients = options_.prescale_gradients;
  ro.gradient_predivide_factor = options_.gradient_predivide_factor;
  ro.communication_data_type = options_.communication_data_type;
  ro.average_over = options_.average_over;
  // Stages 0-1 accumulate gradients over micro-steps in one flat buffer whose
  // views are the parameters' .grad; stages 2-3, and 0-1 without accumulation, reduce
  // every micro-step from per-bucket storage.
  // On one rank the flat buffer may be the gradient partition itself (the alias, where the
  // reduction is the identity bit for bit): the 16-bit model's gradients once, not twice (13.8
  // GB less at 6.92 B parameters), and no copy at the boundary. Not with offload, whose
  // stepper reads the partition a bucket at a time while the next window could write it.
  at::Tensor flat_grads;
  const bool alias = options_.alias_grad_partition && options_.stage < 2 && options_.accumulates &&
                     !options_.offload.enabled && layout_.partition == layout_.total &&
                     master_->grads().device() == opts.device() &&
                     PartitionSink::may_alias(ro, group_->size(), opts.dtype().toScalarType(),
                                              options_.grad_dtype, master_->grads_on_host());
  if (options_.stage < 2 && options_.accumulates)
    flat_grads = alias ? master_->grads() : at::zeros({layout_.total}, opts);
  buckets_ = std::make_unique<GradBuckets>(layout_, flat_grads, store_->params(), opts, group_, ro);
  // Gradient accumulation fusion: linears write their weight gradients into the buckets.
  const auto& params = store_->params();
  std::vector<ops::GradDestination> destinations;
  for (int i = 0; i < static_cast<int>(params.size()); ++i)
    destinations.push_back({[this, i](bool& accumulate) { return buckets_->slot(i, accumulate); },
                            [this, i] { buckets_->written(i); }});
  destinations_ = ops::register_grad_destinations(params, std::move(destinations));
  // Stage 3: this rank keeps only its 16-bit chunks; the parameters are
  // released until their buckets are gathered. After the hooks: autograd's
  // accumulator nodes record a parameter's shape when they are made, and must
  // see the whole one. Before the optimizer state exists, so that the whole
  // 16-bit model and it are never held at once (a model sized for stage 3 would
  // not fit).
  if (options_.stage >= 3) store_->keep_only_partition(master_->whole());
  buckets_->set_partition(master_->grads(), master_->grads_on_host());
  master_->add_shards(options_.group_options);
  describe_shards();
  // The update overlaps backward only where its scale is known before backward (no clipping,
  // no overflow check: neither waits for the global norm), at stages 1-2, with overlap_comm
  // (DeepSpeed's switch for overlapping offload's copies with backward). After the shards exist:
  // whether the optimizer fuses the scale depends on where they are.
  optim::Optimizer& opt = master_->optimizer();
  if (offload_ && (options_.stage == 1 || options_.stage == 2) && options_.overlap_comm &&
      options_.gradient_clipping <= 0 && !options_.check_overflow && opt.elementwise() &&
      opt.fuses_grad_scale() && !master_->split())
    overlap_ = std::make_unique<OffloadOverlap>(layout_, opts.device(), options_.grad_dtype,
                                                opts.dtype().toScalarType(), options_.offload);
}

ZeroOptimizer::~ZeroOptimizer() {
  try {
    store_->wait_all_published();
  } catch (...) {  // a failed collective has been reported by whoever waited on
                   // it first
  }
}

MemoryBreakdown ZeroOptimizer::memory_breakdown() const {
  MemoryBreakdown m;
  store_->add_memory(m);
  if (!master_) return m;  // (the first backward's gradients are the parameters' .grad)
  buckets_->add_memory(m);
  master_->add_memory(m);
  const int64_t staging =
      (offload_ ? offload_->staging_bytes() : 0) + (overlap_ ? overlap_->staging_bytes() : 0);
  if (offload_) m.push_back({"offload.staging", staging, false});
  return m;
}

PhaseTimes ZeroOptimizer::take_phase_times() {
  PhaseTimes t;
  take_phase(t, "step.sumsq", sumsq_ms_);
  if (buckets_) buckets_->sink().take_phase_times(t);
  if (offload_) offload_->take_phase_times(t);
  if (overlap_) overlap_->take_phase_times(t);
  return t;
}

void ZeroOptimizer::arm_overlapped_step(double loss_scale) {
  armed_ = overlap_ != nullptr;
  window_end_ = true;
  armed_loss_scale_ = loss_scale;
}

void ZeroOptimizer::begin_backward(bool reduce) {
  if (!master_) {  // the first backward: its gradients stay in .grad (take_first_backward)
    first_reduce_ = reduce;
    window_end_ = false;
    return;
  }
  // (an overlapped update has the cores during backward, and its step sums the partition after)
  if (window_end_ && reduce && !armed_) buckets_->sink().sum_squares_on_landing();
  window_end_ = false;
  buckets_->begin(reduce);
  if (!armed_ || !reduce) return;
  armed_ = false;
  at::NoGradGuard no_grad;
  store_->wait_all_published();  // the destinations are the flat buffer's
  StepScaleInputs in;
  in.loss_scale = armed_loss_scale_;
  in.deferred = buckets_->sink().deferred_scale();
  // No clip: the scale does not depend on the sum (the same float64 arithmetic as step()'s).
  const StepScale<double> s = unscale_and_clip(0.0, in);
  overlap_destinations_.clear();
  for (size_t b = 0; b < layout_.buckets.size(); ++b)
    overlap_destinations_.push_back(store_->chunk_destination(static_cast<int>(b)));
  overlap_->begin(*master_, at::full({}, static_cast<float>(s.scale), at::kFloat),
                  overlap_destinations_);
  buckets_->set_on_complete([this](int b) { overlap_->reduced(b); });
}

void ZeroOptimizer::end_backward() {
  if (!master_) return take_first_backward();
  buckets_->finish();
  if (overlap_ && overlap_->active()) {
    overlap_->backward_ended();
    buckets_->set_on_complete(nullptr);
  }
  last_issued_early_ = buckets_->issued_during_backward();
}

void ZeroOptimizer::take_first_backward() {
  at::NoGradGuard no_grad;
  // The ready order; parameters never seen last, in reverse registration order.
  std::vector<int> order = first_order_;
  for (int i = static_cast<int>(first_seen_.size()) - 1; i >= 0; --i)
    if (!first_seen_[i]) order.push_back(i);
  // Every rank lays out alike: rank 0's order (ranks could see ties resolved differently).
  if (group_->size() > 1) {
    std::vector<int64_t> wide(order.begin(), order.end());
    at::Tensor t = at::tensor(wide, at::kLong).to(param_options_.device());
    group_->broadcast(t, 0).wait();
    t = t.cpu();
    const int64_t* got = t.data_ptr<int64_t>();
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(got[k]);
  }
  const std::vector<at::Tensor>& params = store_->params();
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    grads.push_back(first_parked_.empty() ? params[i].grad() : std::move(first_parked_[i]));
    params[i].mutable_grad().reset();
  }
  first_parked_.clear();
  build(order);
  // This backward's gradients into the buckets, in the order they came: each is handed over
  // (copied into the flat buffer's view, or taken by its bucket) and let go, so that no more
  // than the one set of them is held beside the buckets.
  buckets_->begin(first_reduce_);
  for (int i : first_order_) {
    if (!grads[i].defined()) continue;
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined()) {
      grad.copy_(grads[i]);  // the flat buffer's view
    } else {
      grad = grads[i].to(params[i].device());  // (a parked one back for its bucket)
    }
    grads[i] = at::Tensor();
    buckets_->mark_ready(i);
  }
  buckets_->finish();
  last_issued_early_ = 0;  // (all of them issued after backward)
  first_order_.clear();
  first_seen_.clear();
}

FlatLayout ZeroOptimizer::lay_out(const std::vector<int>& ready_order) const {
  std::vector<int64_t> numels;
  for (const auto& s : shapes_) numels.push_back(c10::multiply_integers(s));
  // Stages 1-3 partition every bucket over the ranks; stage 0's one partition is the buffer.
  const int parts = options_.stage >= 1 ? group_->size() : 1;
  if (!whole_params_)
    return FlatLayout::build(numels, parts, options_.reduce_bucket_size, options_.alignment,
                             options_.group_of, options_.unit_of, ready_order);
  // Each parameter whole on one rank, the ranks balanced by Newton-Schulz's work: a
  // [.., rows, cols] matrix's iteration costs about rows · cols · min(rows, cols) per matrix.
  std::vector<double> cost;
  for (const auto& s : shapes_) {
    if (s.size() < 2) {
      cost.push_back(static_cast<double>(c10::multiply_integers(s)));
      continue;
    }
    const double rows = static_cast<double>(s[s.size() - 2]), cols = static_cast<double>(s.back());
    const double batch = static_cast<double>(c10::multiply_integers(s.begin(), s.end() - 2));
    cost.push_back(batch * rows * cols * std::min(rows, cols));
  }
  return FlatLayout::build_whole(numels, parts, options_.reduce_bucket_size, options_.alignment,
                                 cost, options_.group_of, options_.unit_of, ready_order);
}

namespace {

// A split matrix's whole from this rank's slice and back (nn/tensor_parallel_attr.h): the
// whole is cut along dim into t · stride pieces, and rank r holds pieces r, r + t, ... in order
// (nn::partition_of's cut, whose inverse whole_of is).
void add_model_split(optim::Optimizer::ShardParam& sp, const ZeroOptions::ModelSplit& split,
                     const std::shared_ptr<comm::ProcessGroup>& group) {
  const int64_t dim = split.dim, stride = split.stride;
  sp.whole_of = [group, dim, stride](const at::Tensor& part) {
    const int t = group->size();
    std::vector<at::Tensor> parts(t);
    for (auto& p : parts) p = at::empty_like(part, at::MemoryFormat::Contiguous);
    group->all_gather(parts, part.contiguous()).wait();
    std::vector<at::Tensor> pieces;
    for (int64_t j = 0; j < stride; ++j)
      for (int r = 0; r < t; ++r) pieces.push_back(parts[r].chunk(stride, dim)[j]);
    return at::cat(pieces, dim);
  };
  sp.part_of = [group, dim, stride](const at::Tensor& whole) {
    return nn::partition_of(whole, dim, stride, group->rank(), group->size());
  };
}

}  // namespace

void ZeroOptimizer::describe_shards() {
  if (!whole_params_) return;
  const int rank = store_->chunk_rank();
  optim::Optimizer& opt = master_->optimizer();
  std::vector<std::vector<optim::Optimizer::ShardParam>> of_group(layout_.groups.size());
  for (int i = 0; i < static_cast<int>(layout_.params.size()); ++i) {
    if (layout_.owner_of(i) != rank) continue;
    const FlatLayout::Param& p = layout_.params[i];
    const FlatLayout::Bucket& b = layout_.buckets[p.bucket];
    const int64_t in_partition = b.part_offset + p.offset - (b.begin + rank * b.chunk);
    of_group[b.group].push_back({in_partition - layout_.groups[b.group].part_begin, shapes_[i]});
    if (!options_.model_split_of.empty() && options_.model_split_of.at(i).dim >= 0)
      add_model_split(of_group[b.group].back(), options_.model_split_of[i], options_.model_group);
  }
  // One shard per group (MasterPartition::add_shards without offload).
  for (size_t g = 0; g < of_group.size(); ++g)
    opt.set_shard_params(static_cast<int>(g), std::move(of_group[g]));
}

at::Tensor ZeroOptimizer::global_sumsq() {
  built();
  at::NoGradGuard no_grad;
  // (on the training device, where the collectives run: a host gradient partition's sum too;
  // its landings may have summed it already)
  const std::optional<double> landed = buckets_->sink().landed_sumsq();
  at::Tensor local = landed ? at::full({}, *landed, at::TensorOptions().dtype(at::kFloat))
                            : master_->local_sumsq();
  at::Tensor stats = local.to(param_options_.device());
  if (options_.reduce_sumsq_across) options_.reduce_sumsq_across(stats);
  if (options_.stage >= 1 && group_->size() > 1)
    group_->all_reduce(stats, comm::ReduceOp::kSum).wait();
  return stats;
}

StepResult ZeroOptimizer::step(double loss_scale, at::Tensor global_sumsq) {
  // The update is arithmetic on buffers, never something autograd should
  // record.
  at::NoGradGuard no_grad;
  built();
  store_->wait_all_published();  // (a forward has normally waited already)
  StepResult result;
  // The global sum of squares carries both verdicts: the norm, and the overflow
  // check (an inf or NaN anywhere makes it non-finite on every rank; DeepSpeed
  // tests a sum the same way).
  at::Tensor stats;
  {
    PhaseTimer timer(sumsq_ms_);
    stats = global_sumsq.defined() ? std::move(global_sumsq) : this->global_sumsq();
  }
  result.global_sumsq = stats;
  StepScaleInputs in;
  in.loss_scale = loss_scale;
  // A 16-bit partition holds sums: the averaging rides on the norm and the
  // unscale.
  in.deferred = buckets_->sink().deferred_scale();
  in.clip = options_.gradient_clipping;
  // An optimizer that skips its update on a non-finite scale takes the overflow
  // verdict on the device: the whole update is queued before the host reads the
  // sum, so the host's wait (for the norm's all-reduce only) leaves the device
  // busy with the update.
  const bool verdict_on_device =
      options_.check_overflow && master_->optimizer().skips_on_nonfinite_scale();
  at::Tensor scale;
  if (options_.check_overflow && !verdict_on_device) {
    // The overflow check needs the sum on the host (to skip the step); since it
    // is there, the norm, the clip and the unscale are worked out there too,
    // instead of as a chain of one-element kernels.
    const double sumsq = stats.item<double>();
    if (!std::isfinite(sumsq)) {
      clear_gradients();
      return result;
    }
    const StepScale<double> s = unscale_and_clip(sumsq, in);
    result.grad_norm = at::full({}, s.norm, at::TensorOptions().dtype(at::kDouble));
    scale = at::full({}, static_cast<float>(s.scale), master_->options());
  } else {
    // Otherwise they stay on the device, and the step enqueues without waiting
    // for it.
    at::Tensor sumsq = stats.to(at::kDouble);
    StepScale<at::Tensor> s = unscale_and_clip(sumsq, in);
    result.grad_norm = s.norm;
    if (verdict_on_device) {
      // An overflow's scale is NaN (without clipping it would be finite), and
      // the sum starts on its way to the host now, ahead of the update in the
      // stream.
      s.scale = at::where(sumsq.isfinite(), s.scale, std::numeric_limits<double>::quiet_NaN());
      verdict_.start(sumsq);
    }
    scale = s.scale.to(at::kFloat);
  }
  if (overlap_ && overlap_->active()) {
    if (armed_loss_scale_ != loss_scale)
      throw Error("ZeroOptimizer: the loss scale changed between backward and step");
    step_overlapped();
    clear_gradients();
    result.applied = true;
    return result;
  }
  master_->apply_scale(scale);
  if (offload_ && master_->optimizer().elementwise()) {
    step_offloaded(scale);
  } else if ((options_.stage == 1 || options_.stage == 2) && master_->optimizer().elementwise()) {
    step_by_bucket(scale);
  } else {
    master_->update(scale);
    store_->publish(master_->whole());
  }
  if (verdict_on_device && !std::isfinite(verdict_.read())) {
    // The update was a no-op on the device; only the step count moved.
    master_->undo_step_count();
    clear_gradients();
    result.grad_norm = at::Tensor();
    return result;
  }
  clear_gradients();
  result.applied = true;
  return result;
}

void ZeroOptimizer::clear_gradients() {
  // A partition the next reduction overwrites whole is left as it is (a pass
  // over it saved).
  master_->clear_gradients(!buckets_->sink().overwrites());
  buckets_->cleared();
}

void ZeroOptimizer::step_by_bucket(const at::Tensor& scale) {
  // Bucket by bucket: update this rank's chunk (writing its 16-bit copy
  // straight where the store publishes it from), then publish the bucket while
  // the next chunk updates (on a GPU the all-gather runs on NCCL's stream,
  // after the chunk's cast). The same arithmetic per element as one whole
  // update followed by publish_master().
  master_->begin_bucket_updates();
  std::vector<comm::Work> works;
  const bool defer = options_.defer_allgather;
  // Deferred, the buckets go in the forward's order (the reverse of backward's,
  // which made the layout), so the next forward's first layers are the first to
  // arrive.
  const int n = static_cast<int>(layout_.buckets.size());
  for (int k = 0; k < n; ++k) {
    const int b = defer ? n - 1 - k : k;
    at::Tensor mine = store_->chunk_destination(b);
    master_->update_bucket(b, scale, mine);
    comm::Work w = store_->publish_bucket(b, mine);
    if (defer)
      store_->defer(b, std::move(w));
    else
      works.push_back(std::move(w));
  }
  for (auto& w : works) w.wait();
}

void ZeroOptimizer::step_overlapped() {
  // The buckets were updated as backward reduced them; each is published once its update is
  // done (deferred: in the forward's order, so the first layers' all-gathers go first).
  const bool defer = options_.defer_allgather;
  const int n = static_cast<int>(layout_.buckets.size());
  std::vector<comm::Work> works;
  for (int k = 0; k < n; ++k) {
    const int b = defer ? n - 1 - k : k;
    overlap_->wait(b);
    comm::Work w = store_->publish_bucket(b, overlap_destinations_[b]);
    if (defer)
      store_->defer(b, std::move(w));
    else
      works.push_back(std::move(w));
  }
  overlap_->finish();
  for (auto& w : works) w.wait();
  overlap_destinations_.clear();
}

void ZeroOptimizer::step_offloaded(const at::Tensor& scale) {
  // As step_by_bucket, with each bucket's update on the host: its gradient chunk down, the CPU
  // optimizer over it in sub_group_size pieces, its 16-bit chunk up to where the store
  // publishes it from, then its publish (all-gather at stages 1-2; stage 3 keeps the chunk).
  master_->begin_bucket_updates();
  const bool defer = options_.defer_allgather;
  const int n = static_cast<int>(layout_.buckets.size());
  std::vector<int> order(n);
  for (int k = 0; k < n; ++k) order[k] = defer ? n - 1 - k : k;
  std::vector<at::Tensor> mine(n);
  std::vector<comm::Work> works;
  offload_->step(
      *master_, order, scale,
      [&](int b) -> at::Tensor {
        if (!mine[b].defined()) mine[b] = store_->chunk_destination(b);
        return mine[b];
      },
      [&](int b) {
        comm::Work w = store_->publish_bucket(b, mine[b]);
        if (defer)
          store_->defer(b, std::move(w));
        else
          works.push_back(std::move(w));
      });
  for (auto& w : works) w.wait();
}

}  // namespace dscpp::zero
