// MasterPartition: see master_partition.h.
#include "dscpp/zero/master_partition.h"

#include <ATen/ATen.h>

namespace dscpp::zero {

MasterPartition::MasterPartition(const FlatLayout& layout, at::TensorOptions options,
                                 std::unique_ptr<optim::Optimizer> optimizer,
                                 at::ScalarType grad_dtype, bool on_host)
    : layout_(layout),
      master_(at::empty({layout.partition}, on_host ? at::TensorOptions().dtype(at::kFloat)
                                                    : options.dtype(at::kFloat))),
      grads_(at::zeros({layout.partition}, options.dtype(grad_dtype))),
      optimizer_(std::move(optimizer)) {}

void MasterPartition::add_shards(const std::vector<optim::Hyper>& group_options) {
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const auto& gr = layout_.groups[g];
    optimizer_->add_shard(master_.slice(0, gr.part_begin, gr.part_end),
                          g < group_options.size() ? group_options[g] : optim::Hyper::object());
  }
}

void MasterPartition::relayout(const std::function<at::Tensor(const at::Tensor&)>& relay) {
  // One buffer at a time, in place where the partition keeps its size, so that only one
  // re-laid copy exists at any moment (a partition sized to fit has no room for one per
  // buffer). The shards are re-seated, not set_data'd: a shard is a view of the master, and a
  // view keeps its base alive (a whole old fp32 partition stayed held, measured on an H200).
  for (const auto& name : state_names()) {
    at::Tensor whole = state_partition(name);
    if (whole.numel() != master_.numel()) continue;
    at::Tensor moved = relay(whole);
    whole = at::Tensor();
    if (moved.numel() == master_.numel()) {
      load_state_partition(name, moved);  // into the state tensors themselves
    } else {
      for (int g = 0; g < optimizer_->num_shards(); ++g) {
        const auto& gr = layout_.groups[g];
        optimizer_->state(g)[name] = moved.slice(0, gr.part_begin, gr.part_end);
      }
    }
  }
  auto move_buffer = [&](at::Tensor& buffer) {
    at::Tensor moved = relay(buffer);
    if (moved.numel() == buffer.numel()) {
      buffer.copy_(moved);
    } else {
      buffer = moved;
    }
  };
  move_buffer(master_);
  move_buffer(grads_);
  for (int g = 0; g < optimizer_->num_shards(); ++g) {
    const auto& gr = layout_.groups[g];
    optimizer_->reseat_shard(g, master_.slice(0, gr.part_begin, gr.part_end));
  }
}

at::Tensor MasterPartition::local_sumsq() const {
  return at::linalg_vector_norm(grads_, 2, c10::nullopt, false, at::kFloat).square();
}

void MasterPartition::apply_scale(const at::Tensor& scale) {
  if (!optimizer_->fuses_grad_scale() && grads_.scalar_type() == at::kFloat) grads_.mul_(scale);
}

at::Tensor MasterPartition::update_grad(int64_t begin, int64_t end, const at::Tensor& scale) {
  // fp32: already unscaled unless the optimizer fuses the scale. 16 bits: as it is for an
  // optimizer that reads 16 bits and fuses the scale; otherwise widened (and unscaled) here,
  // a range at a time, so no whole fp32 copy of the partition is ever made at stages 1-2.
  return as_taken(grads_.slice(0, begin, end), scale);
}

at::Tensor MasterPartition::as_taken(at::Tensor grad, const at::Tensor& scale) {
  if (grad.scalar_type() == at::kFloat) return grad;
  const bool fused = optimizer_->fuses_grad_scale();
  if (fused && optimizer_->reads_16bit_grads()) return grad;
  grad = grad.to(at::kFloat);
  if (!fused) grad.mul_(scale);
  return grad;
}

void MasterPartition::update(const at::Tensor& scale) {
  std::vector<at::Tensor> grads;
  for (const auto& gr : layout_.groups)
    // (to the master's device: a host copy when the master is offloaded)
    grads.push_back(update_grad(gr.part_begin, gr.part_end, scale).to(master_.device()));
  optimizer_->step(grads, optimizer_->fuses_grad_scale() ? scale : at::Tensor());
}

void MasterPartition::update_bucket(int b, const at::Tensor& scale, const at::Tensor& copy16) {
  const auto& bucket = layout_.buckets[b];
  const int64_t in_shard = bucket.part_offset - layout_.groups[bucket.group].part_begin;
  optimizer_->update_range(
      bucket.group, in_shard, in_shard + bucket.chunk,
      update_grad(bucket.part_offset, bucket.part_offset + bucket.chunk, scale),
      optimizer_->fuses_grad_scale() ? scale : at::Tensor(), copy16);
}

void MasterPartition::update_piece(int b, int64_t offset, const at::Tensor& grad,
                                   const at::Tensor& scale, const at::Tensor& copy16) {
  const auto& bucket = layout_.buckets[b];
  const int64_t in_shard = bucket.part_offset + offset - layout_.groups[bucket.group].part_begin;
  // An fp32 piece is unscaled here unless the optimizer fuses the scale (apply_scale did the
  // device partition's in place, which the piece was copied from).
  optimizer_->update_range(bucket.group, in_shard, in_shard + grad.numel(), as_taken(grad, scale),
                           optimizer_->fuses_grad_scale() ? scale : at::Tensor(), copy16);
}

void MasterPartition::undo_step_count() {
  for (int g = 0; g < optimizer_->num_shards(); ++g) --optimizer_->step_count(g);
}

void MasterPartition::clear_gradients(bool zero) {
  if (zero) grads_.zero_();
}

std::vector<std::string> MasterPartition::state_names() {
  std::vector<std::string> names;
  for (const auto& [name, t] : optimizer_->state(0)) names.push_back(name);
  return names;
}

at::Tensor MasterPartition::state_partition(const std::string& name) {
  if (optimizer_->num_shards() == 1) return optimizer_->state(0).at(name);
  std::vector<at::Tensor> parts;
  for (int g = 0; g < optimizer_->num_shards(); ++g) parts.push_back(optimizer_->state(g).at(name));
  return at::cat(parts);
}

void MasterPartition::load_state_partition(const std::string& name, const at::Tensor& values) {
  for (int g = 0; g < optimizer_->num_shards(); ++g) {
    const auto& gr = layout_.groups[g];
    at::Tensor& dst = optimizer_->state(g).at(name);
    at::Tensor src = values.slice(0, gr.part_begin, gr.part_end);
    if (!dst.is_same(src)) dst.copy_(src);
  }
}

void MasterPartition::set_step_count(int64_t steps) {
  for (int g = 0; g < optimizer_->num_shards(); ++g) optimizer_->step_count(g) = steps;
}

}  // namespace dscpp::zero
