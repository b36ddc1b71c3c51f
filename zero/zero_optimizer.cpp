// ZeroOptimizer: see zero_optimizer.h.
#include "zero/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "zero/grad_hooks.h"

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
                              options_.group_of);

  const auto opts = params_.empty() ? at::TensorOptions().dtype(at::kFloat) : params_[0].options();
  flat_params_ = at::zeros({layout_.total}, opts);
  flat_grads_ = at::zeros({layout_.total}, opts);
  for (const auto& p : params_) param_shapes_.push_back(p.sizes().vec());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& lp = layout_.params[i];
    at::Tensor view =
        flat_params_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes());
    view.copy_(params_[i].detach());
    // The module's parameter now lives in the flat buffer, and autograd accumulates its
    // gradient straight into the flat gradient buffer.
    params_[i].set_data(view);
    grad_views_.push_back(
        flat_grads_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes()));
    params_[i].mutable_grad() = grad_views_.back();
  }
  // Every rank starts from rank 0's weights, as DeepSpeed broadcasts the model at init.
  if (group_->size() > 1) group_->broadcast(flat_params_, 0).wait();

  master_ = at::empty({layout_.partition}, opts.dtype(at::kFloat));
  refresh_master_from_params();
  grad_partition_ = at::zeros_like(master_);
  // One optimizer shard per parameter group: the group's chunks, contiguous in the partition.
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const auto& gr = layout_.groups[g];
    optimizer_->add_shard(
        master_.slice(0, gr.part_begin, gr.part_end),
        g < options_.group_options.size() ? options_.group_options[g] : optim::Hyper::object());
  }

  ReduceOptions ro;
  ro.scatter = partitioned(options_);
  ro.overlap_comm = options_.overlap_comm;
  ro.use_reduce_scatter = options_.reduce_scatter;
  ro.prescale_gradients = options_.prescale_gradients;
  ro.gradient_predivide_factor = options_.gradient_predivide_factor;
  ro.communication_data_type = options_.communication_data_type;
  buckets_ = std::make_unique<GradBuckets>(layout_, flat_grads_, group_, ro);
  hooks_ = register_ready_hooks(params_, [this](int i) { buckets_->mark_ready(i); });
  if (params_partitioned(options_)) {
    // Stage 3: this rank keeps only its 16-bit chunks; the parameters are released until
    // gather() brings the whole buffer back. After the hooks: autograd's accumulator nodes
    // record a parameter's shape when they are made, and must see the whole one.
    part16_ = master_.to(flat_params_.scalar_type());
    gathered_ = true;
    release();
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::begin_backward(bool reduce) {
  // A module's zero_grad() (set_to_none by default) or an assignment to .grad detaches a
  // parameter from the flat buffer, and autograd would then accumulate where no bucket
  // looks: point it back before autograd runs.
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].grad().is_same(grad_views_[i])) params_[i].mutable_grad() = grad_views_[i];
  buckets_->begin(reduce);
}

void ZeroOptimizer::end_backward() {
  buckets_->finish(grad_partition_);
}

StepResult ZeroOptimizer::step(double loss_scale) {
  // The update is arithmetic on buffers, never something autograd should record.
  at::NoGradGuard no_grad;
  StepResult result;
  const bool across = partitioned(options_) && group_->size() > 1;
  // One small all-reduce carries both verdicts: [sum of squares, overflow flag].
  at::Tensor stats = at::stack({grad_partition_.square().sum(),
                                options_.check_overflow
                                    ? grad_partition_.isfinite().logical_not().any().to(at::kFloat)
                                    : at::zeros({}, grad_partition_.options())});
  if (across) group_->all_reduce(stats, comm::ReduceOp::kSum).wait();
  at::Tensor host = stats.cpu();
  const double sumsq = host[0].item<double>();
  const bool overflow =
      options_.check_overflow && (host[1].item<double>() > 0 || !std::isfinite(sumsq));
  if (overflow) {
    grad_partition_.zero_();
    return result;
  }
  result.grad_norm = std::sqrt(sumsq) / loss_scale;
  // DeepSpeed's combined unscale and clip: divide by the loss scale, and further by
  // (norm + 1e-6) / clip when that exceeds 1.
  double combined = loss_scale;
  if (options_.gradient_clipping > 0) {
    double clip = (result.grad_norm + 1e-6) / options_.gradient_clipping;
    if (clip > 1) combined *= clip;
  }
  if (combined != 1.0) grad_partition_.mul_(1.0 / combined);
  std::vector<at::Tensor> grads;
  for (const auto& gr : layout_.groups)
    grads.push_back(grad_partition_.slice(0, gr.part_begin, gr.part_end));
  optimizer_->step(grads);
  grad_partition_.zero_();
  publish_master();
  result.applied = true;
  return result;
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
  if (params_partitioned(options_) && !gathered_ && part16_.defined()) {
    master_.copy_(part16_);
    return;
  }
  const int r = layout_rank();
  for (const auto& b : layout_.buckets)
    master_.slice(0, b.part_offset, b.part_offset + b.chunk)
        .copy_(flat_params_.slice(0, b.begin + r * b.chunk, b.begin + (r + 1) * b.chunk));
}

void ZeroOptimizer::gather() {
  if (!params_partitioned(options_) || gathered_) return;
  const auto opts = part16_.options();
  flat_params_ = at::empty({layout_.total}, opts);
  std::vector<comm::Work> works;
  for (const auto& b : layout_.buckets) {
    at::Tensor out = flat_params_.slice(0, b.begin, b.end);
    at::Tensor mine = part16_.slice(0, b.part_offset, b.part_offset + b.chunk);
    if (group_->size() == 1) {
      out.copy_(mine);
    } else {
      works.push_back(group_->all_gather(out, mine));
    }
  }
  for (auto& w : works) w.wait();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& lp = layout_.params[i];
    params_[i].set_data(
        flat_params_.slice(0, lp.offset, lp.offset + lp.numel).view(param_shapes_[i]));
  }
  gathered_ = true;
  ++gathers_;
}

void ZeroOptimizer::release() {
  if (!params_partitioned(options_) || !gathered_) return;
  // A parameter at rest is an empty tensor of its dtype and device, as in DeepSpeed; the
  // gathered buffer is freed with the last view of it.
  for (auto& p : params_) p.set_data(at::empty({0}, part16_.options()));
  flat_params_ = at::Tensor();
  gathered_ = false;
}

void ZeroOptimizer::scatter_gathered_from(int src_rank) {
  if (!params_partitioned(options_) || !gathered_) return;
  // Every rank takes src_rank's values, then keeps its own chunks of them.
  if (group_->size() > 1) group_->broadcast(flat_params_, src_rank).wait();
  const int r = group_->rank();
  for (const auto& b : layout_.buckets) {
    at::Tensor mine = flat_params_.slice(0, b.begin + r * b.chunk, b.begin + (r + 1) * b.chunk);
    part16_.slice(0, b.part_offset, b.part_offset + b.chunk).copy_(mine);
    master_.slice(0, b.part_offset, b.part_offset + b.chunk).copy_(mine);
  }
}

int64_t ZeroOptimizer::params_numel_held() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

void ZeroOptimizer::publish_master() {
  if (params_partitioned(options_)) {
    // Only this rank's 16-bit chunks change; the next gather() spreads them.
    part16_.copy_(master_);
    if (gathered_) {
      release();
      gather();
    }
    return;
  }
  if (!partitioned(options_)) {
    flat_params_.copy_(master_);
    return;
  }
  std::vector<comm::Work> works;
  std::vector<at::Tensor> inputs;
  for (const auto& b : layout_.buckets) {
    inputs.push_back(
        master_.slice(0, b.part_offset, b.part_offset + b.chunk).to(flat_params_.scalar_type()));
    at::Tensor out = flat_params_.slice(0, b.begin, b.end);
    if (group_->size() == 1) {
      out.copy_(inputs.back());
      continue;
    }
    works.push_back(group_->all_gather(out, inputs.back()));
  }
  for (auto& w : works) w.wait();
}

}  // namespace dscpp::zero
