// Optimizers on flat fp32 shards (ZeRO's partitions): each shard is one contiguous 1-D fp32
// tensor updated in place, with its optimizer state of the same size kept here. One
// optimizer serves all of a rank's shards; each shard carries its parameter group's
// hyper-parameters. Numerics follow PyTorch's torch.optim (and DeepSpeed's Lamb / Lion /
// Adagrad), element for element.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/config/ds_config.h"

namespace dscpp::optim {

// A parameter group's hyper-parameters. Keys as in DeepSpeed's optimizer "params":
// lr, betas, eps, weight_decay, momentum, nesterov, dampening, bias_correction,
// adam_w_mode, max_coeff, min_coeff, ... (each optimizer reads its own).
using Hyper = nlohmann::json;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // The optimizer's name as DeepSpeed spells its type ("adamw", "lamb", "SGD", ...).
  virtual std::string name() const = 0;

  // Registers a shard (1-D fp32, updated in place by step) with its group's
  // hyper-parameters (defaults filled from the config's params). Returns its index.
  int add_shard(at::Tensor param, const Hyper& overrides = Hyper::object());

  // One update of every shard: grads[i] is shard i's gradient (1-D, same size; fp32, or bf16
  // or fp16 widened to fp32 as it is read: by the optimizer itself where reads_16bit_grads(),
  // otherwise by a copy here).
  // Grads are already averaged; unscaled and clipped too, unless grad_scale (a 0-dim fp32
  // tensor on the shards' device) is given: then each gradient counts as grad * grad_scale,
  // which only an optimizer that fuses_grad_scale() accepts.
  void step(const std::vector<at::Tensor>& grads, const at::Tensor& grad_scale = {});
  // Whether step() takes grad_scale: the fused CUDA Adam multiplies as it reads the
  // gradient, saving a pass over it, and reads the scale on the device (no host wait).
  virtual bool fuses_grad_scale() const { return false; }
  // Whether a non-finite grad_scale makes the update a no-op on the device (every shard and
  // its state unchanged, a param_copy written from the unchanged values), so that ZeRO can
  // queue an update before the host knows whether the gradients overflowed. The step count
  // advances all the same: the caller takes it back on an overflow.
  virtual bool skips_on_nonfinite_scale() const { return false; }
  // Whether update() reads bf16 / fp16 gradients itself (the fused CUDA Adam), sparing ZeRO's
  // 16-bit gradient partition an fp32 copy.
  virtual bool reads_16bit_grads() const { return false; }

  // The same update in pieces, for an elementwise optimizer (an element's update reads only
  // that element's state; Lamb's trust ratio does not qualify): begin_step() once, then
  // update_range() over disjoint ranges that cover every shard, each with its slice of the
  // gradient. ZeRO uses it to all-gather a bucket while the next one updates.
  virtual bool elementwise() const { return false; }
  void begin_step();
  // param_copy (optional): a 16-bit tensor of end - begin elements that receives the updated
  // parameters (ZeRO's published weights): written by the update itself when
  // writes_param_copy(), else copied from the range after it.
  void update_range(int shard, int64_t begin, int64_t end, const at::Tensor& grad,
                    const at::Tensor& grad_scale = {}, const at::Tensor& param_copy = {});
  // The same update of a range held elsewhere (ZeRO-Infinity's swap buffers, zero/nvme_swap.h):
  // param and state (by the names state(shard) has) are that range's values, updated in
  // place with the shard's hyper-parameters and step count. The shard itself is not touched.
  void update_detached(int shard, const at::Tensor& param,
                       const std::map<std::string, at::Tensor>& state, const at::Tensor& grad,
                       const at::Tensor& grad_scale = {}, const at::Tensor& param_copy = {});
  // Whether update() writes a param_copy like `copy` itself (the fused CUDA Adam, from its
  // registers, a bf16 or fp16 one).
  virtual bool writes_param_copy(const at::Tensor& copy) const {
    (void)copy;
    return false;
  }

  // The parameters lying whole in shard i: where each starts in the shard and its shape. An
  // optimizer that updates a parameter as a whole (Muon orthogonalises each matrix) keeps
  // them and needs_whole_params(): ZeRO then lays its partitions out so that every parameter
  // lies whole in one rank's (zero/flat_layout.h, build_whole) and gives each shard its
  // parameters. An elementwise optimizer ignores them.
  struct ShardParam {
    int64_t offset = 0;
    std::vector<int64_t> shape;
    // A parameter that is this rank's slice of a matrix split over model ranks (tensor
    // parallelism): whole_of gives the whole matrix from a slice-shaped tensor (a collective
    // over the model group: every model rank calls it for the same parameters in the same
    // order), part_of this rank's slice of a whole-shaped one. Empty: the parameter is whole.
    std::function<at::Tensor(const at::Tensor&)> whole_of = {};
    std::function<at::Tensor(const at::Tensor&)> part_of = {};
  };
  virtual bool needs_whole_params() const { return false; }
  virtual void set_shard_params(int shard, std::vector<ShardParam> params) {
    (void)shard;
    (void)params;
  }
  // Where an update that is not elementwise computes its matrices' part (Muon's Newton-Schulz)
  // when the shards live elsewhere (on the host under ZeRO-Offload): each matrix goes there and
  // back. Elementwise optimizers ignore it.
  virtual void set_compute_device(c10::Device device) { (void)device; }

  // ZeRO-Offload's CPU optimizers (ops/cpu_adam.h, DeepSpeed's DeepSpeedCPUAdam / CPUAdagrad /
  // CPULion): Adam, AdamW, Adagrad and Lion update shards on the CPU with the vectorised,
  // threaded kernels, which also read 16-bit gradients, fuse grad_scale and write a
  // param_copy in the same pass. Off: the ATen ops that match torch.optim to the bit. Other
  // optimizers ignore it (has_cpu_kernels() false).
  virtual bool has_cpu_kernels() const { return false; }
  void set_cpu_kernels(bool on) { cpu_kernels_ = on && has_cpu_kernels(); }
  bool cpu_kernels() const { return cpu_kernels_; }

  // The learning rate and first momentum coefficient of every group, as LR schedules set
  // them (DeepSpeed's schedulers write param_group["lr"]; OneCycle writes "betas" only, so it
  // leaves SGD's momentum alone). With no shard yet they are the defaults later shards take;
  // a set value is also every later shard's, over its group's own (as for those that exist).
  double get_lr(int shard = 0) const;
  // The lr a shard added now with `overrides` (its group's settings) would take.
  double lr_for(const Hyper& overrides) const;
  void set_lr(double lr);
  double get_momentum(int shard = 0) const;  // betas[0] for Adam-like, momentum for SGD
  void set_momentum(double momentum);

  // A fresh optimizer of the same kind and settings, with no shard (ZeRO's partial offload,
  // offload_optimizer.ratio < 1, steps the part of the partition kept on the device with
  // one). nullptr: this optimizer cannot make one (a client's own).
  virtual std::unique_ptr<Optimizer> make_like() const { return nullptr; }
  // Shard i takes shard j of `from`'s hyper-parameters, and `from`'s defaults: what a
  // schedule wrote there reaches this one.
  void copy_hyper(int i, const Optimizer& from, int j) {
    shards_.at(i).hyper = from.shards_.at(j).hyper;
    defaults_ = from.defaults_;
  }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const at::Tensor& shard(int i) const { return shards_.at(i).param; }
  const Hyper& hyper(int i) const { return shards_.at(i).hyper; }
  // The shard's state tensors by PyTorch's names ("exp_avg", "exp_avg_sq",
  // "momentum_buffer", "sum", ...) and its step count: what checkpoints save.
  std::map<std::string, at::Tensor>& state(int i) { return shards_.at(i).state; }
  int64_t& step_count(int i) { return shards_.at(i).steps; }
  // Elements of state held for all shards (the ZeRO memory claim is asserted on this).
  int64_t state_numel() const;

 protected:
  explicit Optimizer(Hyper defaults) : defaults_(std::move(defaults)) {}
  struct Shard {
    at::Tensor param;
    Hyper hyper;
    std::map<std::string, at::Tensor> state;
    int64_t steps = 0;
  };
  // make_like() for a concrete optimizer: a copy of its settings without the shards.
  template <class T>
  static std::unique_ptr<Optimizer> fresh_copy(const T& self) {
    auto o = std::make_unique<T>(self);
    o->shards_.clear();
    return o;
  }
  // Creates the shard's state (zeros; Adagrad's sum at its initial value) when the shard is
  // registered, so checkpoints can load into it before the first step.
  virtual void init_state(Shard& s) = 0;
  // Updates s.param in place from grad; s.steps is already incremented. grad_scale_: see
  // step() (set only for optimizers that fuse it, during step).
  virtual void update(Shard& s, const at::Tensor& grad) = 0;
  // update() on a range's shard of views (update_range, update_detached).
  void update_part(Shard& part, const at::Tensor& grad, const at::Tensor& grad_scale,
                   const at::Tensor& param_copy);
  const at::Tensor* grad_scale_ = nullptr;
  const at::Tensor* param_copy_ = nullptr;  // during update_range, when writes_param_copy()
  static bool gradient_type(const at::Tensor& grad);  // fp32, bf16 or fp16
  at::Tensor as_read(const at::Tensor& grad) const;   // what update() is given
  // Checks a group's hyper-parameters and fills the defaults; ConfigError names path.key.
  // strict (a config's params): unknown keys are errors, as DeepSpeed's constructors raise
  // TypeError; otherwise (a group's overrides) they are kept, as torch keeps group keys.
  virtual Hyper resolve(const Hyper& given, const std::string& path, bool strict) const = 0;
  // Schedules write every group's lr and betas, as DeepSpeed's write param_groups.
  friend class LRScheduler;

  // Whether this step runs on the CPU kernels (set_cpu_kernels, and the shards on the CPU).
  bool on_cpu_kernels() const {
    return cpu_kernels_ && !shards_.empty() && shards_[0].param.device().is_cpu();
  }
  // What a CPU kernel takes from a step: the grad scale as a float (1 without one) and
  // param_copy_ when there is one.
  float grad_scale_value() const;

  static void set_momentum_of(Hyper& h, double momentum);

  Hyper defaults_;
  std::vector<Shard> shards_;
  bool cpu_kernels_ = false;
  std::optional<double> scheduled_lr_, scheduled_momentum_;  // set_lr's, set_momentum's
};

// Builds the optimizer the config names (case-insensitive: Adam, AdamW, Lamb, SGD, Lion,
// Adagrad; OneBitAdam/ZeroOneAdam as Adam and OneBitLamb as Lamb), with DeepSpeed's
// defaults for params the config leaves out. Throws ConfigError for an unknown name or a
// bad param.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);

}  // namespace dscpp::optim
