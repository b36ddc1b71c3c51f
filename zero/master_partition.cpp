// MasterPartition: see master_partition.h.
#include "dscpp/zero/master_partition.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "dscpp/error.h"
#include "dscpp/ops/pinned_memory.h"
#include "dscpp/ops/sum_of_squares.h"

namespace dscpp::zero {

namespace {
const char* kMasterFile = "fp32_master";  // the swap file of the fp32 master
}  // namespace

int64_t HostShare::host_begin(int64_t partition) const {
  if (ratio >= 1.0 || partition == 0) return 0;
  const int64_t size = std::max<int64_t>(1, sub_group_size);
  const int64_t count = (partition + size - 1) / size;
  // DeepSpeed: sub-group i is on the CPU when i >= int((1 - ratio) * count).
  const auto on_device = static_cast<int64_t>((1.0 - ratio) * static_cast<double>(count));
  return std::min(partition, on_device * size);
}

MasterPartition::MasterPartition(const FlatLayout& layout, at::TensorOptions options,
                                 std::unique_ptr<optim::Optimizer> optimizer,
                                 at::ScalarType grad_dtype, bool on_host, HostShare share,
                                 const NvmeOptions* nvme, bool grads_on_host, bool pin_grads)
    : layout_(layout),
      host_begin_(on_host ? share.host_begin(layout.partition) : layout.partition),
      optimizer_(std::move(optimizer)) {
  const int64_t n = layout.partition;
  const auto host = at::TensorOptions().dtype(at::kFloat);
  const auto dev = options.dtype(at::kFloat);
  offloaded_ = on_host;
  grads_on_host_ = on_host && host_begin_ == 0 && grads_on_host;
  pin_grads_ = grads_on_host_ && pin_grads;
  if (grads_on_host_) {
    grads_ = ops::host_empty(n, grad_dtype, pin_grads_);
    grads_.zero_();
  } else {
    grads_ = at::zeros({n}, options.dtype(grad_dtype));
  }
  if (on_host && nvme && nvme->enabled) {
    if (host_begin_ != 0)
      throw Error("NVMe offload: partial offload (offload_optimizer.ratio < 1) is for device cpu");
    if (!optimizer_->elementwise() || !optimizer_->make_like())
      throw Error("NVMe offload steps the partition a piece at a time: optimizer '" +
                  optimizer_->name() + "' is not elementwise (Adam, AdamW, Adagrad, Lion are)");
    // The optimizer's shards are empty: the values are in the files.
    primary_ = at::empty({0}, host);
    swap_ = std::make_unique<NvmeSwapper>(*nvme, n);
    swap_->add(kMasterFile);
    return;
  }
  if (!on_host || host_begin_ == 0) {
    whole_ = at::empty({n}, on_host ? host : dev);
    primary_ = whole_;
    return;
  }
  // Partial offload: the head on the device, stepped by an optimizer of its own.
  device_opt_ = optimizer_->make_like();
  if (!device_opt_)
    throw Error("partial offload (offload_optimizer.ratio < 1): optimizer '" + optimizer_->name() +
                "' cannot make a second instance for the device's part");
  if (!optimizer_->elementwise())
    throw Error(
        "partial offload (offload_optimizer.ratio < 1) needs an elementwise optimizer "
        "(Adam, AdamW, Adagrad, Lion): '" +
        optimizer_->name() + "' is not");
  if (options.device().is_cpu()) {
    // The "device" is the host: one tensor, both parts views of it.
    whole_ = at::empty({n}, host);
    device_ = whole_.slice(0, 0, host_begin_);
    primary_ = whole_.slice(0, host_begin_, n);
  } else {
    device_ = at::empty({host_begin_}, dev);
    primary_ = at::empty({n - host_begin_}, host);
  }
}

std::vector<MasterPartition::Side> MasterPartition::sides() {
  if (!split()) return {{optimizer_.get(), primary_, 0, layout_.partition}};
  return {{device_opt_.get(), device_, 0, host_begin_},
          {optimizer_.get(), primary_, host_begin_, layout_.partition}};
}

MasterPartition::Side MasterPartition::side_of(int64_t begin, int64_t end) {
  for (const Side& s : sides())
    if (s.begin <= begin && end <= s.end) return s;
  throw Error("MasterPartition: partition range [" + std::to_string(begin) + ", " +
              std::to_string(end) + ") lies across the device/host cut at " +
              std::to_string(host_begin_));
}

std::pair<int64_t, int64_t> MasterPartition::shard_range(const Side& s, int g) const {
  const auto& gr = layout_.groups[g];
  const int64_t lo = std::min(std::max(gr.part_begin, s.begin), s.end);
  const int64_t hi = std::max(lo, std::min(gr.part_end, s.end));
  return {lo - s.begin, hi - s.begin};
}

void MasterPartition::add_shards(const std::vector<optim::Hyper>& group_options) {
  if (swap_) {
    auto options_of = [&](size_t g) {
      return g < group_options.size() ? group_options[g] : optim::Hyper::object();
    };
    for (size_t g = 0; g < layout_.groups.size(); ++g)
      optimizer_->add_shard(primary_, options_of(g));
    if (optimizer_->num_shards() == 0) return;
    for (const auto& [name, t] : optimizer_->state(0)) swap_->add(name);
    // A state's initial value (Adagrad's initial_accumulator_value), group by group, from a
    // one-element shard of the same optimizer.
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      auto probe = optimizer_->make_like();
      probe->add_shard(at::zeros({1}, at::TensorOptions().dtype(at::kFloat)), options_of(g));
      for (const auto& [name, t] : probe->state(0)) {
        const float v = t.item<float>();
        if (v != 0.0f)
          swap_->fill(name, layout_.groups[g].part_begin, layout_.groups[g].part_end, v);
      }
    }
    return;
  }
  for (const Side& s : sides()) {
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      const auto [lo, hi] = shard_range(s, static_cast<int>(g));
      s.opt->add_shard(s.master.slice(0, lo, hi),
                       g < group_options.size() ? group_options[g] : optim::Hyper::object());
    }
  }
}

at::Tensor MasterPartition::whole() {
  if (swap_) return swap_->read_all(kMasterFile);
  if (whole_.defined()) return whole_;
  return at::cat({device_.cpu(), primary_});
}

void MasterPartition::assign(const at::Tensor& values) {
  if (swap_) return swap_->write_all(kMasterFile, values);
  if (whole_.defined()) {
    if (!values.is_same(whole_)) whole_.copy_(values);
    return;
  }
  device_.copy_(values.slice(0, 0, host_begin_));
  primary_.copy_(values.slice(0, host_begin_, layout_.partition));
}

void MasterPartition::add_memory(MemoryBreakdown& m) const {
  m.push_back({"grad_partition", bytes_of(grads_), !grads_on_host_});
  // Partial offload: the head on the device, the tail (primary_) on the host.
  m.push_back({"fp32_master", bytes_of(primary_), !offloaded_});
  if (device_.defined()) m.push_back({"fp32_master", bytes_of(device_), true});
  auto add_states = [&](optim::Optimizer& opt, bool on_device) {
    for (int g = 0; g < opt.num_shards(); ++g)
      for (const auto& [name, t] : opt.state(g))
        m.push_back({"optimizer." + name, bytes_of(t), on_device});
  };
  add_states(*optimizer_, !offloaded_);
  if (device_opt_) add_states(*device_opt_, true);
}

at::Tensor MasterPartition::local_sumsq() const {
  return ops::sum_of_squares(grads_);
}

void MasterPartition::apply_scale(const at::Tensor& scale) {
  bool all_fuse = optimizer_->fuses_grad_scale();
  if (device_opt_) all_fuse = all_fuse && device_opt_->fuses_grad_scale();
  scaled_in_place_ = !all_fuse && grads_.scalar_type() == at::kFloat;
  if (scaled_in_place_) grads_.mul_(scale.to(grads_.device()));
}

std::pair<at::Tensor, at::Tensor> MasterPartition::as_taken(at::Tensor grad,
                                                            const at::Tensor& scale,
                                                            const Side& s) const {
  // fp32: already unscaled where apply_scale did it. 16 bits: as it is for an optimizer that
  // reads 16 bits and fuses the scale; otherwise widened (and unscaled) here, a range at a
  // time, so no whole fp32 copy of the partition is ever made at stages 1-2.
  const bool fused = s.opt->fuses_grad_scale();
  const c10::Device at_ = s.master.device();
  const at::Tensor sc = !scale.defined() || scale.device() == at_ ? scale : scale.to(at_);
  if (grad.scalar_type() == at::kFloat) {
    if (scaled_in_place_) return {grad, at::Tensor()};
    if (fused) return {grad, sc};
    return {grad * sc.to(grad.device()), at::Tensor()};
  }
  if (fused && s.opt->reads_16bit_grads()) return {grad, sc};
  grad = grad.to(at::kFloat);
  if (fused) return {grad, sc};
  grad.mul_(sc.to(grad.device()));
  return {grad, at::Tensor()};
}

void MasterPartition::update(const at::Tensor& scale) {
  if (swap_) throw Error("NVMe offload: the partition is stepped a piece at a time only");
  if (device_opt_)
    for (int g = 0; g < device_opt_->num_shards(); ++g) device_opt_->copy_hyper(g, *optimizer_, g);
  for (const Side& s : sides()) {
    std::vector<at::Tensor> grads;
    at::Tensor taken_scale;
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      const auto [lo, hi] = shard_range(s, static_cast<int>(g));
      auto [grad, sc] = as_taken(grads_.slice(0, s.begin + lo, s.begin + hi), scale, s);
      // (to the master's device: a host copy when the master is offloaded)
      grads.push_back(grad.to(s.master.device()));
      taken_scale = sc;
    }
    s.opt->step(grads, taken_scale);
  }
}

void MasterPartition::begin_bucket_updates() {
  optimizer_->begin_step();
  if (!device_opt_) return;
  device_opt_->begin_step();
  for (int g = 0; g < device_opt_->num_shards(); ++g) device_opt_->copy_hyper(g, *optimizer_, g);
}

void MasterPartition::update_range(int g, int64_t begin, const at::Tensor& grad,
                                   const at::Tensor& scale, const at::Tensor& copy16) {
  const int64_t n = grad.numel();
  const Side s = side_of(begin, begin + n);
  const int64_t in_shard = begin - s.begin - shard_range(s, g).first;
  auto [taken, sc] = as_taken(grad, scale, s);
  if (swap_) {
    // The range in a swap buffer (read ahead); written back behind the next ones.
    std::map<std::string, at::Tensor> held = swap_->acquire(begin, begin + n);
    const at::Tensor param = held.at(kMasterFile);
    s.opt->update_detached(g, param, held, taken, sc, copy16);
    swap_->release();
    return;
  }
  s.opt->update_range(g, in_shard, in_shard + n, taken, sc, copy16);
}

void MasterPartition::update_bucket(int b, const at::Tensor& scale, const at::Tensor& copy16) {
  const auto& bucket = layout_.buckets[b];
  update_range(bucket.group, bucket.part_offset,
               grads_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk), scale,
               copy16);
}

void MasterPartition::update_piece(int b, int64_t offset, const at::Tensor& grad,
                                   const at::Tensor& scale, const at::Tensor& copy16) {
  const auto& bucket = layout_.buckets[b];
  update_range(bucket.group, bucket.part_offset + offset, grad, scale, copy16);
}

void MasterPartition::plan_pieces(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (swap_) swap_->plan(ranges);
}

void MasterPartition::finish_pieces() {
  if (swap_) swap_->finish();
}

void MasterPartition::undo_step_count() {
  for (const Side& s : sides())
    for (int g = 0; g < s.opt->num_shards(); ++g) --s.opt->step_count(g);
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
  if (swap_) return swap_->read_all(name);
  if (!split() && optimizer_->num_shards() == 1) return optimizer_->state(0).at(name);
  // Partition order: group by group, the device's part of each before the host's. On two
  // devices the whole is gathered on the host.
  const bool two_devices = split() && !whole_.defined();
  std::vector<at::Tensor> parts;
  for (size_t g = 0; g < layout_.groups.size(); ++g)
    for (const Side& s : sides()) {
      const at::Tensor& t = s.opt->state(static_cast<int>(g)).at(name);
      parts.push_back(two_devices ? t.cpu() : t);
    }
  return at::cat(parts);
}

void MasterPartition::load_state_partition(const std::string& name, const at::Tensor& values) {
  if (swap_) return swap_->write_all(name, values);
  for (const Side& s : sides()) {
    for (size_t g = 0; g < layout_.groups.size(); ++g) {
      const auto [lo, hi] = shard_range(s, static_cast<int>(g));
      at::Tensor& dst = s.opt->state(static_cast<int>(g)).at(name);
      at::Tensor src = values.slice(0, s.begin + lo, s.begin + hi);
      if (!dst.is_same(src)) dst.copy_(src);
    }
  }
}

void MasterPartition::set_step_count(int64_t steps) {
  for (const Side& s : sides())
    for (int g = 0; g < s.opt->num_shards(); ++g) s.opt->step_count(g) = steps;
}

}  // namespace dscpp::zero
