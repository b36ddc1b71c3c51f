// ZeroOptimizer: see zero_optimizer.h.
#include "dscpp/zero/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dscpp/error.h"
#include "dscpp/zero/grad_hooks.h"

namespace dscpp::zero {

namespace {
bool partitioned(const ZeroOptions& o) {
  return o.stage >= 1;
}
bool params_partitioned(const ZeroOptions& o) {
  return o.stage >= 3;
}
}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<at::Tensor> params,
                             std::unique_ptr<optim::Optimizer> optimizer,
                             std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options)
    : options_(options),
      group_(std::move(group)),
      params_(std::move(params)),
      optimizer_(std::move(optimizer)) {
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  const int parts = partitioned(options_) ? group_->size() : 1;
  layout_ = FlatLayout::build(numels, parts, options_.reduce_bucket_size, options_.alignment,
                              options_.group_of, options_.unit_of);

  const auto opts = params_.empty() ? at::TensorOptions().dtype(at::kFloat) : params_[0].options();
  // Stages 0-1 accumulate gradients over micro-steps in one flat buffer whose views are the
  // parameters' .grad; stages 2-3 reduce every micro-step from per-bucket storage.
  const bool flat_grads = options_.stage < 2;
  flat_params_ = at::zeros({layout_.total}, opts);
  if (flat_grads) flat_grads_ = at::zeros({layout_.total}, opts);
  for (const auto& p : params_) param_shapes_.push_back(p.sizes().vec());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& lp = layout_.params[i];
    at::Tensor view =
        flat_params_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes());
    view.copy_(params_[i].detach());
    // The module's parameter now lives in the flat buffer, and (stages 0-1) autograd
    // accumulates its gradient straight into the flat gradient buffer.
    params_[i].set_data(view);
    if (!flat_grads) {
      params_[i].mutable_grad().reset();
      continue;
    }
    grad_views_.push_back(
        flat_grads_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes()));
    params_[i].mutable_grad() = grad_views_.back();
  }
  // Every rank starts from rank 0's weights, as DeepSpeed broadcasts the model at init.
  if (group_->size() > 1) group_->broadcast(flat_params_, 0).wait();

  master_ = at::empty({layout_.partition}, opts.dtype(at::kFloat));
  refresh_master_from_params();

  ReduceOptions ro;
  ro.scatter = partitioned(options_);
  ro.overlap_comm = options_.overlap_comm;
  ro.use_reduce_scatter = options_.reduce_scatter;
  ro.prescale_gradients = options_.prescale_gradients;
  ro.gradient_predivide_factor = options_.gradient_predivide_factor;
  ro.communication_data_type = options_.communication_data_type;
  ro.skip_collectives = options_.skip_collectives;
  buckets_ = std::make_unique<GradBuckets>(layout_, flat_grads_, params_, opts, group_, ro);
  hooks_ = register_ready_hooks(params_, [this](int i) { buckets_->mark_ready(i); });
  if (options_.grad_dtype != at::kFloat && options_.grad_dtype != opts.dtype().toScalarType())
    throw dscpp::Error(
        "ZeroOptimizer: a 16-bit gradient partition must be of the "
        "parameters' type");
  // Allocated while the whole 16-bit model is still held (stage 3 releases it below): after
  // that release it would be carved out of the released buffer's segment, and the rest of
  // that segment (16 GiB at 17 B parameters) could then hold neither Adam moment nor return
  // to the device.
  grad_partition_ = at::zeros_like(master_, master_.options().dtype(options_.grad_dtype));
  if (params_partitioned(options_)) {
    // Stage 3: this rank keeps only its 16-bit chunks; the parameters are released until
    // their buckets are gathered. After the hooks: autograd's accumulator nodes record a
    // parameter's shape when they are made, and must see the whole one. Before the optimizer
    // state exists, so that the whole 16-bit model and it are never held at once (a model
    // sized for stage 3 would not fit).
    part16_ = master_.to(flat_params_.scalar_type());
    buckets16_.resize(layout_.buckets.size());
    for (auto& p : params_) p.set_data(at::empty({0}, part16_.options()));
    flat_params_ = at::Tensor();
  }
  buckets_->set_partition(grad_partition_);
  // One optimizer shard per parameter group: the group's chunks, contiguous in the partition.
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const auto& gr = layout_.groups[g];
    optimizer_->add_shard(
        master_.slice(0, gr.part_begin, gr.part_end),
        g < options_.group_options.size() ? options_.group_options[g] : optim::Hyper::object());
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  try {
    wait_all_published();
  } catch (...) {  // a failed collective has been reported by whoever waited on it first
  }
}

void ZeroOptimizer::wait_published(int bucket) {
  if (pending_publishes_ == 0) return;
  comm::Work& w = published_.at(bucket);
  if (!w.defined()) return;
  w.wait();
  w = comm::Work();
  --pending_publishes_;
}

void ZeroOptimizer::wait_all_published() {
  for (size_t b = 0; pending_publishes_ > 0 && b < published_.size(); ++b)
    wait_published(static_cast<int>(b));
}

void ZeroOptimizer::begin_backward(bool reduce) {
  // A module's zero_grad() (set_to_none by default) or an assignment to .grad detaches a
  // parameter from the flat buffer, and autograd would then accumulate where no bucket
  // looks: point it back before autograd runs. With per-bucket storage (stages 2-3) .grad
  // must start empty, so that autograd's result is this backward's gradient alone.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (grad_views_.empty()) {
      params_[i].mutable_grad().reset();
    } else if (!params_[i].grad().is_same(grad_views_[i])) {
      params_[i].mutable_grad() = grad_views_[i];
    }
  }
  buckets_->begin(reduce);
}

void ZeroOptimizer::end_backward() {
  buckets_->finish();
}

StepResult ZeroOptimizer::step(double loss_scale) {
  // The update is arithmetic on buffers, never something autograd should record.
  at::NoGradGuard no_grad;
  wait_all_published();  // (a forward has normally waited already)
  StepResult result;
  const bool across = partitioned(options_) && group_->size() > 1;
  // The global sum of squares carries both verdicts: the norm, and the overflow check (an
  // inf or NaN anywhere makes it non-finite on every rank; DeepSpeed tests a sum the same
  // way). This rank's part is its partition's norm, squared: one pass that reads the
  // gradients once (a 16-bit partition widened as it is read, accumulated in fp32), with no
  // temporary of the partition's size, which for a large model is gigabytes.
  at::Tensor stats =
      at::linalg_vector_norm(grad_partition_, 2, c10::nullopt, false, at::kFloat).square();
  if (across) group_->all_reduce(stats, comm::ReduceOp::kSum).wait();
  // A 16-bit partition holds sums: the averaging rides on the norm and the unscale.
  const double deferred = buckets_->deferred_scale();
  // An optimizer that skips its update on a non-finite scale takes the overflow verdict on
  // the device: the whole update is queued before the host reads the sum, so the host's
  // wait (for the norm's all-reduce only) leaves the device busy with the update.
  const bool verdict_on_device = options_.check_overflow && optimizer_->skips_on_nonfinite_scale();
  at::Tensor scale;
  if (options_.check_overflow && !verdict_on_device) {
    // The overflow check needs the sum on the host (to skip the step); since it is there,
    // the norm, the clip and the unscale are worked out there too, in the same float64
    // arithmetic as the device branch below, instead of as a chain of one-element kernels.
    const double sumsq = stats.item<double>();
    if (!std::isfinite(sumsq)) {
      clear_gradients();
      return result;
    }
    double norm = std::sqrt(sumsq);
    if (deferred != 1.0) norm = norm * deferred;
    norm = norm / loss_scale;
    result.grad_norm = at::full({}, norm, at::TensorOptions().dtype(at::kDouble));
    double combined = loss_scale;
    if (options_.gradient_clipping > 0)
      combined = combined * std::max((norm + 1e-6) / options_.gradient_clipping, 1.0);
    double scale64 = 1.0 / combined;
    if (deferred != 1.0) scale64 = scale64 * deferred;
    scale = at::full({}, static_cast<float>(scale64), master_.options());
  } else {
    // Otherwise the norm, the clip and the unscale stay on the device, in float64 as the
    // host would compute them, and the step enqueues without waiting for the device.
    at::Tensor sumsq = stats.to(at::kDouble);
    at::Tensor norm = sumsq.sqrt();
    if (deferred != 1.0) norm = norm * deferred;
    result.grad_norm = norm / loss_scale;
    // DeepSpeed's combined unscale and clip: divide by the loss scale, and further by
    // (norm + 1e-6) / clip when that exceeds 1.
    at::Tensor combined = at::full({}, loss_scale, sumsq.options());
    if (options_.gradient_clipping > 0)
      combined = combined * ((result.grad_norm + 1e-6) / options_.gradient_clipping).clamp_min(1.0);
    at::Tensor scale64 = combined.reciprocal();
    if (deferred != 1.0) scale64 = scale64 * deferred;
    if (verdict_on_device) {
      // An overflow's scale is NaN (without clipping it would be finite), and the sum starts
      // on its way to the host now, ahead of the update in the stream.
      scale64 = at::where(sumsq.isfinite(), scale64, std::numeric_limits<double>::quiet_NaN());
      verdict_.start(sumsq);
    }
    scale = scale64.to(at::kFloat);
  }
  // An optimizer that multiplies by the scale as it reads the gradient saves a pass over it.
  if (!optimizer_->fuses_grad_scale() && grad_partition_.scalar_type() == at::kFloat)
    grad_partition_.mul_(scale);
  if ((options_.stage == 1 || options_.stage == 2) && optimizer_->elementwise()) {
    step_by_bucket(scale);
  } else {
    std::vector<at::Tensor> grads;
    for (const auto& gr : layout_.groups)
      grads.push_back(update_grad(gr.part_begin, gr.part_end, scale));
    optimizer_->step(grads, optimizer_->fuses_grad_scale() ? scale : at::Tensor());
    publish_master();
  }
  if (verdict_on_device && !std::isfinite(verdict_.read())) {
    // The update was a no-op on the device; only the step count moved.
    for (int g = 0; g < optimizer_->num_shards(); ++g) --optimizer_->step_count(g);
    clear_gradients();
    result.grad_norm = at::Tensor();
    return result;
  }
  clear_gradients();
  result.applied = true;
  return result;
}

void ZeroOptimizer::clear_gradients() {
  // A partition the next reduction overwrites whole is left as it is (a pass over it saved).
  if (!buckets_->overwrites_partition()) grad_partition_.zero_();
  buckets_->cleared();
}

at::Tensor ZeroOptimizer::update_grad(int64_t begin, int64_t end, const at::Tensor& grad_scale) {
  // fp32: already unscaled unless the optimizer fuses the scale. 16 bits: as it is for an
  // optimizer that reads 16 bits and fuses the scale; otherwise widened (and unscaled) here,
  // a range at a time, so no whole fp32 copy of the partition is ever made at stages 1-2.
  at::Tensor grad = grad_partition_.slice(0, begin, end);
  if (grad.scalar_type() == at::kFloat) return grad;
  const bool fused = optimizer_->fuses_grad_scale();
  if (fused && optimizer_->reads_16bit_grads()) return grad;
  grad = grad.to(at::kFloat);
  if (!fused) grad.mul_(grad_scale);
  return grad;
}

void ZeroOptimizer::step_by_bucket(const at::Tensor& grad_scale) {
  // Bucket by bucket: update this rank's chunk, then all-gather the bucket while the next
  // chunk updates (on a GPU the all-gather runs on NCCL's stream, after the chunk's cast).
  // The same arithmetic per element as one whole step followed by publish_master().
  optimizer_->begin_step();
  std::vector<comm::Work> works;
  const bool defer = options_.defer_allgather;
  if (defer) published_.resize(layout_.buckets.size());
  // Deferred, the buckets go in the forward's order (the reverse of backward's, which made
  // the layout), so the next forward's first layers are the first to arrive.
  const int n = static_cast<int>(layout_.buckets.size());
  for (int k = 0; k < n; ++k) {
    const int i = defer ? n - 1 - k : k;
    const auto& b = layout_.buckets[i];
    const int64_t in_shard = b.part_offset - layout_.groups[b.group].part_begin;
    // The update writes the chunk's 16-bit copy too; on a GPU straight into this rank's
    // place in the bucket, which the all-gather then fills in place around it.
    at::Tensor whole = flat_params_.slice(0, b.begin, b.end);
    at::Tensor mine = in_place_gather()
                          ? whole.slice(0, group_->rank() * b.chunk, (group_->rank() + 1) * b.chunk)
                          : at::empty({b.chunk}, flat_params_.options());
    optimizer_->update_range(b.group, in_shard, in_shard + b.chunk,
                             update_grad(b.part_offset, b.part_offset + b.chunk, grad_scale),
                             optimizer_->fuses_grad_scale() ? grad_scale : at::Tensor(), mine);
    comm::Work w = gather_chunks(whole, mine);
    if (!defer) {
      works.push_back(std::move(w));
    } else if (w.defined()) {
      published_[i] = std::move(w);
      ++pending_publishes_;
    }
  }
  for (auto& w : works) w.wait();
}

bool ZeroOptimizer::in_place_gather() const {
  // NCCL all-gathers in place (the input at the rank's offset in the output); Gloo's is
  // not documented to, so on the CPU the chunk goes through its own tensor.
  return flat_params_.defined() && flat_params_.is_cuda();
}

comm::Work ZeroOptimizer::gather_chunks(at::Tensor whole, const at::Tensor& mine) {
  const int64_t r = group_->rank();
  at::Tensor place = whole.slice(0, r * mine.numel(), (r + 1) * mine.numel());
  const bool in_place = place.data_ptr() == mine.data_ptr();
  if (options_.skip_collectives) {  // only this rank's chunk is current
    if (!in_place) place.copy_(mine);
    return comm::Work();
  }
  if (group_->size() > 1) return group_->all_gather(whole, mine);
  if (!in_place) whole.copy_(mine);
  return comm::Work();
}

comm::Work ZeroOptimizer::publish_bucket(int i) {
  const auto& b = layout_.buckets[i];
  // The collective keeps the cast chunk alive until it has run.
  return gather_chunks(
      flat_params_.slice(0, b.begin, b.end),
      master_.slice(0, b.part_offset, b.part_offset + b.chunk).to(flat_params_.scalar_type()));
}

std::vector<std::string> ZeroOptimizer::state_names() {
  std::vector<std::string> names;
  for (const auto& [name, t] : optimizer_->state(0)) names.push_back(name);
  return names;
}

at::Tensor ZeroOptimizer::state_partition(const std::string& name) {
  if (optimizer_->num_shards() == 1) return optimizer_->state(0).at(name);
  std::vector<at::Tensor> parts;
  for (int g = 0; g < optimizer_->num_shards(); ++g) parts.push_back(optimizer_->state(g).at(name));
  return at::cat(parts);
}

void ZeroOptimizer::load_state_partition(const std::string& name, const at::Tensor& values) {
  for (int g = 0; g < optimizer_->num_shards(); ++g) {
    const auto& gr = layout_.groups[g];
    at::Tensor& dst = optimizer_->state(g).at(name);
    at::Tensor src = values.slice(0, gr.part_begin, gr.part_end);
    if (!dst.is_same(src)) dst.copy_(src);
  }
}

void ZeroOptimizer::set_step_count(int64_t steps) {
  for (int g = 0; g < optimizer_->num_shards(); ++g) optimizer_->step_count(g) = steps;
}

int ZeroOptimizer::layout_rank() const {
  return partitioned(options_) ? group_->rank() : 0;
}

void ZeroOptimizer::refresh_master_from_params() {
  wait_all_published();
  // Stage 3 (once constructed): the 16-bit partition is the parameters' truth.
  if (part16_.defined()) {
    master_.copy_(part16_);
    return;
  }
  const int r = layout_rank();
  for (const auto& b : layout_.buckets)
    master_.slice(0, b.part_offset, b.part_offset + b.chunk)
        .copy_(flat_params_.slice(0, b.begin + r * b.chunk, b.begin + (r + 1) * b.chunk));
}

bool ZeroOptimizer::gathered() const {
  if (!params_partitioned(options_)) return true;
  for (const auto& g : buckets16_)
    if (g.state != BucketState::kGathered) return false;
  return true;
}

ZeroOptimizer::BucketState ZeroOptimizer::bucket_state(int b) const {
  return params_partitioned(options_) ? buckets16_.at(b).state : BucketState::kGathered;
}

bool ZeroOptimizer::persistent(int b) const {
  return params_partitioned(options_) && buckets16_.at(b).persistent;
}

void ZeroOptimizer::start_gather(int b) {
  if (!params_partitioned(options_)) return;
  Gathered& g = buckets16_.at(b);
  if (g.state != BucketState::kRest) return;
  const auto& bucket = layout_.buckets[b];
  g.buffer = at::empty({bucket.end - bucket.begin}, part16_.options());
  g.work = gather_chunks(g.buffer,
                         part16_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk));
  g.state = BucketState::kInFlight;
  if (!g.persistent) {
    live_ += g.buffer.numel();
    peak_live_ = std::max(peak_live_, live_);
  }
  ++gathers_;
}

void ZeroOptimizer::finish_gather(int b) {
  if (!params_partitioned(options_)) return;
  Gathered& g = buckets16_.at(b);
  if (g.state == BucketState::kGathered) return;
  if (g.state == BucketState::kRest) start_gather(b);
  g.work.wait();
  g.work = comm::Work();
  const auto& bucket = layout_.buckets[b];
  for (int i : bucket.params) {
    const auto& lp = layout_.params[i];
    params_[i].set_data(
        g.buffer.slice(0, lp.offset - bucket.begin, lp.offset - bucket.begin + lp.numel)
            .view(param_shapes_[i]));
  }
  g.state = BucketState::kGathered;
}

void ZeroOptimizer::release_bucket(int b) {
  if (!params_partitioned(options_)) return;
  Gathered& g = buckets16_.at(b);
  if (g.state == BucketState::kRest) return;
  if (g.state == BucketState::kInFlight) g.work.wait();  // a collective in flight keeps its buffer
  g.work = comm::Work();
  // A parameter at rest is an empty tensor of its dtype and device, as in DeepSpeed; the
  // bucket's buffer is freed with the last view of it.
  for (int i : layout_.buckets[b].params) params_[i].set_data(at::empty({0}, part16_.options()));
  if (!g.persistent) live_ -= g.buffer.numel();
  g.buffer = at::Tensor();
  g.state = BucketState::kRest;
}

void ZeroOptimizer::make_persistent(int b) {
  if (!params_partitioned(options_)) return;
  Gathered& g = buckets16_.at(b);
  if (g.persistent) return;
  if (g.state != BucketState::kRest) live_ -= g.buffer.numel();
  g.persistent = true;
  finish_gather(b);
}

void ZeroOptimizer::gather() {
  wait_all_published();  // stages 1-2: a GatheredParameters scope reads the parameters
  if (!params_partitioned(options_)) return;
  for (size_t b = 0; b < buckets16_.size(); ++b) start_gather(static_cast<int>(b));
  for (size_t b = 0; b < buckets16_.size(); ++b) finish_gather(static_cast<int>(b));
}

void ZeroOptimizer::release() {
  if (!params_partitioned(options_)) return;
  for (size_t b = 0; b < buckets16_.size(); ++b)
    if (!buckets16_[b].persistent) release_bucket(static_cast<int>(b));
}

void ZeroOptimizer::scatter_gathered_from(int src_rank) {
  if (!params_partitioned(options_)) return;
  const int r = group_->rank();
  for (size_t b = 0; b < buckets16_.size(); ++b) {
    Gathered& g = buckets16_[b];
    if (g.state == BucketState::kRest) continue;
    finish_gather(static_cast<int>(b));
    // Every rank takes src_rank's values, then keeps its own chunk of them.
    if (group_->size() > 1) group_->broadcast(g.buffer, src_rank).wait();
    const auto& bucket = layout_.buckets[b];
    at::Tensor mine = g.buffer.slice(0, r * bucket.chunk, (r + 1) * bucket.chunk);
    part16_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk).copy_(mine);
    master_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk).copy_(mine);
  }
}

int64_t ZeroOptimizer::params_numel_held() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

void ZeroOptimizer::publish_master() {
  wait_all_published();
  if (params_partitioned(options_)) {
    // Only this rank's 16-bit chunks change; the next gather spreads them. Buckets gathered
    // now (persistent ones, or all inside a GatheredParameters scope) are refreshed in place.
    part16_.copy_(master_);
    std::vector<comm::Work> works;
    for (size_t b = 0; b < buckets16_.size(); ++b) {
      Gathered& g = buckets16_[b];
      if (g.state == BucketState::kRest) continue;
      finish_gather(static_cast<int>(b));
      const auto& bucket = layout_.buckets[b];
      works.push_back(gather_chunks(
          g.buffer, part16_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk)));
    }
    for (auto& w : works) w.wait();
    return;
  }
  if (!partitioned(options_)) {
    flat_params_.copy_(master_);
    return;
  }
  std::vector<comm::Work> works;
  for (size_t i = 0; i < layout_.buckets.size(); ++i)
    works.push_back(publish_bucket(static_cast<int>(i)));
  for (auto& w : works) w.wait();
}

}  // namespace dscpp::zero
