// The optimizers on flat shards. Adam/AdamW, SGD and Adagrad repeat torch.optim's
// single-tensor update op for op (same ATen ops, same scalar arithmetic in double), so a shard
// matches PyTorch on CPU to the last bit or so; Lamb and Lion follow DeepSpeed's kernels'
// formulas (csrc/lamb/fused_lamb_cuda_kernel.cu, csrc/lion/multi_tensor_lion.cu).
#include <ATen/ops/empty.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "dscpp/config/config_error.h"
#include "dscpp/config/section.h"
#include "dscpp/ops/cpu_adam.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/optim/param_reader.h"
#ifdef DSCPP_CUDA
#include "dscpp/error.h"
#include "dscpp/ops/fused_adam.h"
#endif

namespace dscpp::optim {

namespace {

double num(const Hyper& h, const char* key) {
  return h.at(key).get<double>();
}
bool flag(const Hyper& h, const char* key) {
  return h.at(key).get<bool>();
}
double beta(const Hyper& h, int i) {
  return h.at("betas").at(i).get<double>();
}

// What every algorithm shares: its DeepSpeed name, and whether a config's unknown params are
// errors (the 1-bit variants' compression params mean nothing to plain training).
class Algorithm : public Optimizer {
 public:
  std::string name() const override { return name_; }

 protected:
  Algorithm(std::string name, bool ignore_unknown)
      : Optimizer(Hyper::object()), name_(std::move(name)), ignore_unknown_(ignore_unknown) {}
  // Strict reading keeps only the algorithm's own keys; a group's other keys stay otherwise.
  static Hyper start(const Hyper& given, bool strict) { return strict ? Hyper::object() : given; }
  void finish(const ParamReader& r, bool strict) const {
    if (strict && !ignore_unknown_) r.finish();
  }
  void configure(const Hyper& params) { defaults_ = resolve(params, "optimizer.params", true); }
  // A CPU kernel's tensors for this update.
  ops::cpu::StepTensors cpu_tensors(const at::Tensor& p, const at::Tensor& grad) const {
    ops::cpu::StepTensors t;
    t.param = p;
    t.grad = grad.contiguous();
    t.grad_scale = grad_scale_value();
    if (param_copy_) t.param_copy = *param_copy_;
    return t;
  }
  // Adagrad's and Lion's: what the CPU kernels change (Adam has its CUDA path too).
  bool fuses_grad_scale() const override { return on_cpu_kernels(); }
  bool reads_16bit_grads() const override { return on_cpu_kernels(); }
  bool writes_param_copy(const at::Tensor&) const override { return on_cpu_kernels(); }

 private:
  std::string name_;
  bool ignore_unknown_;
};

// DeepSpeed's FusedAdam / DeepSpeedCPUAdam with torch.optim.Adam(W)'s arithmetic. decoupled:
// AdamW's weight decay (p *= 1 - lr*wd); otherwise L2 (grad += wd*p).
class Adam final : public Algorithm {
 public:
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  Adam(std::string name, bool decoupled, double default_weight_decay, const Hyper& params,
       bool ignore_unknown)
      : Algorithm(std::move(name), ignore_unknown),
        decoupled_(decoupled),
        default_weight_decay_(default_weight_decay) {
    configure(params);
  }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override {
    ParamReader r(given, path);
    Hyper h = start(given, strict);
    h["lr"] = r.number("lr", 1e-3, 0);
    h["betas"] = r.betas("betas", {0.9, 0.999});
    h["eps"] = r.number("eps", 1e-8, 0);
    h["weight_decay"] = r.number("weight_decay", default_weight_decay_, 0);
    h["bias_correction"] = r.flag("bias_correction", true);
    r.must_be_false("amsgrad", "DeepSpeed's FusedAdam has no AMSGrad");
    r.must_be_false("maximize", "not implemented");
    r.tolerate({"set_grad_none", "fp32_optimizer_states", "foreach", "fused", "capturable",
                "differentiable"});
    finish(r, strict);
    return h;
  }

  bool elementwise() const override { return true; }
  bool has_cpu_kernels() const override { return true; }

  bool on_cuda() const {
#ifdef DSCPP_CUDA
    return !shards_.empty() && shards_[0].param.is_cuda();
#else
    return false;
#endif
  }
  bool fuses_grad_scale() const override {
    return on_cuda() || on_cpu_kernels();
  }
  bool reads_16bit_grads() const override {
    return fuses_grad_scale();
  }
  bool skips_on_nonfinite_scale() const override {
    return on_cuda();
  }
  bool writes_param_copy(const at::Tensor& copy) const override {
    const auto type = copy.scalar_type();
    return on_cpu_kernels() || (on_cuda() && (type == at::kBFloat16 || type == at::kHalf));
  }

  void init_state(Shard& s) override {
    s.state["exp_avg"] = at::zeros_like(s.param);
    s.state["exp_avg_sq"] = at::zeros_like(s.param);
  }

  // The fused kernels' arguments: the CUDA and the CPU kernel take the same fields.
  template <typename Args>
  Args kernel_args(const Shard& s, double lr, double b1, double b2, double eps, double wd) const {
    Args a;
    a.lr = lr;
    a.beta1 = b1;
    a.beta2 = b2;
    a.eps = eps;
    a.weight_decay = wd;
    a.step = s.steps;
    a.bias_correction = flag(s.hyper, "bias_correction");
    a.adam_w_mode = decoupled_;
    return a;
  }

  void update(Shard& s, const at::Tensor& grad) override {
    const Hyper& h = s.hyper;
    const double lr = num(h, "lr"), b1 = beta(h, 0), b2 = beta(h, 1), eps = num(h, "eps");
    const double wd = num(h, "weight_decay");
    at::Tensor& p = s.param;
    at::Tensor& m = s.state.at("exp_avg");
    at::Tensor& v = s.state.at("exp_avg_sq");
#ifdef DSCPP_CUDA
    // A shard on a GPU: the same arithmetic in one fused kernel (ops/fused_adam.cu).
    if (p.is_cuda()) {
      auto a = kernel_args<ops::cuda::AdamArgs>(s, lr, b1, b2, eps, wd);
      if (grad_scale_) a.grad_scale = grad_scale_;
      if (param_copy_) a.param_copy = param_copy_;
      ops::cuda::fused_adam_step(p, grad.contiguous(), m, v, a);
      return;
    }
#endif
    if (on_cpu_kernels()) {
      ops::cpu::adam_step(cpu_tensors(p, grad), m, v,
                          kernel_args<ops::cpu::AdamArgs>(s, lr, b1, b2, eps, wd));
      return;
    }
    at::Tensor g = grad;
    if (wd != 0) {
      if (decoupled_)
        p.mul_(1 - lr * wd);
      else
        g = grad.add(p, wd);
    }
    m.lerp_(g, 1 - b1);
    v.mul_(b2).addcmul_(g, g, 1 - b2);
    // bias_correction false (FusedAdam's option) is the same update with both corrections 1.
    const bool bc = flag(h, "bias_correction");
    const double step = static_cast<double>(s.steps);
    const double bias_correction1 = bc ? 1 - std::pow(b1, step) : 1.0;
    const double bias_correction2 = bc ? 1 - std::pow(b2, step) : 1.0;
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);  // Python's **0.5
    at::Tensor denom = v.sqrt().div_(bias_correction2_sqrt).add_(eps);
    p.addcdiv_(m, denom, -step_size);
  }

 private:
  bool decoupled_;
  double default_weight_decay_;
};

// torch.optim.SGD.
class SGD final : public Algorithm {
 public:
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  explicit SGD(const Hyper& params) : Algorithm("SGD", false) { configure(params); }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override {
    ParamReader r(given, path);
    Hyper h = start(given, strict);
    const double momentum = r.number("momentum", 0, 0);
    const double dampening = r.number("dampening", 0);
    const bool nesterov = r.flag("nesterov", false);
    if (nesterov && (momentum <= 0 || dampening != 0))
      r.fail("nesterov", "false unless momentum > 0 and dampening is 0 (as torch.optim.SGD)");
    h["lr"] = r.number("lr", 1e-3, 0);
    h["momentum"] = momentum;
    h["dampening"] = dampening;
    h["weight_decay"] = r.number("weight_decay", 0, 0);
    h["nesterov"] = nesterov;
    r.must_be_false("maximize", "not implemented");
    r.tolerate({"foreach", "differentiable", "fused"});
    finish(r, strict);
    return h;
  }

  void init_state(Shard& s) override {
    if (num(s.hyper, "momentum") != 0) s.state["momentum_buffer"] = at::zeros_like(s.param);
  }

  void update(Shard& s, const at::Tensor& grad) override {
    const Hyper& h = s.hyper;
    const double lr = num(h, "lr"), momentum = num(h, "momentum");
    const double wd = num(h, "weight_decay");
    at::Tensor& p = s.param;
    at::Tensor g = wd != 0 ? grad.add(p, wd) : grad;
    if (momentum != 0) {
      // torch starts the buffer as a copy of the first gradient it sees, undamped.
      auto it = s.state.find("momentum_buffer");
      if (it == s.state.end())
        it = s.state.emplace("momentum_buffer", g.clone()).first;
      else if (s.steps == 1)
        it->second.copy_(g);
      else
        it->second.mul_(momentum).add_(g, 1 - num(h, "dampening"));
      g = flag(h, "nesterov") ? g.add(it->second, momentum) : it->second;
    }
    p.add_(g, -lr);
  }
};

// torch.optim.Adagrad (DeepSpeed's choice without CPU offload; DeepSpeedCPUAdagrad takes the
// same defaults).
class Adagrad final : public Algorithm {
 public:
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  explicit Adagrad(const Hyper& params) : Algorithm("adagrad", false) { configure(params); }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override {
    ParamReader r(given, path);
    Hyper h = start(given, strict);
    h["lr"] = r.number("lr", 1e-2, 0);
    h["lr_decay"] = r.number("lr_decay", 0, 0);
    h["weight_decay"] = r.number("weight_decay", 0, 0);
    h["initial_accumulator_value"] = r.number("initial_accumulator_value", 0, 0);
    h["eps"] = r.number("eps", 1e-10, 0);
    r.must_be_false("maximize", "not implemented");
    r.tolerate({"foreach", "differentiable", "fused", "amsgrad", "fp32_optimizer_states"});
    finish(r, strict);
    return h;
  }

  bool elementwise() const override { return true; }
  bool has_cpu_kernels() const override { return true; }

  void init_state(Shard& s) override {
    s.state["sum"] = at::full_like(s.param, num(s.hyper, "initial_accumulator_value"));
  }

  void update(Shard& s, const at::Tensor& grad) override {
    const Hyper& h = s.hyper;
    const double wd = num(h, "weight_decay");
    at::Tensor& p = s.param;
    at::Tensor& sum = s.state.at("sum");
    if (on_cpu_kernels()) {
      ops::cpu::AdagradArgs a;
      a.lr = num(h, "lr");
      a.eps = num(h, "eps");
      a.weight_decay = wd;
      a.lr_decay = num(h, "lr_decay");
      a.step = s.steps;
      ops::cpu::adagrad_step(cpu_tensors(p, grad), sum, a);
      return;
    }
    at::Tensor g = wd != 0 ? grad.add(p, wd) : grad;
    const double clr = num(h, "lr") / (1 + (static_cast<double>(s.steps) - 1) * num(h, "lr_decay"));
    sum.addcmul_(g, g, 1);
    at::Tensor std = sum.sqrt().add_(num(h, "eps"));
    p.addcdiv_(g, std, -clr);
  }
};

// DeepSpeed's FusedLion / DeepSpeedCPULion: c = b1*m + (1-b1)*g; p = p*(1 - lr*wd) -
// lr*sign(c); m = b2*m + (1-b2)*g. Where c is exactly 0 the kernels disagree (CUDA steps by
// +lr, CPU by the sign of the zero); here, as in the paper, sign(0) = 0 leaves p alone.
class Lion final : public Algorithm {
 public:
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  explicit Lion(const Hyper& params) : Algorithm("lion", false) { configure(params); }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override {
    ParamReader r(given, path);
    Hyper h = start(given, strict);
    h["lr"] = r.number("lr", 1e-3, 0);
    h["betas"] = r.betas("betas", {0.9, 0.999});
    h["weight_decay"] = r.number("weight_decay", 0, 0);
    r.tolerate({"set_grad_none", "fp32_optimizer_states"});
    finish(r, strict);
    return h;
  }

  bool elementwise() const override { return true; }
  bool has_cpu_kernels() const override { return true; }

  void init_state(Shard& s) override { s.state["exp_avg"] = at::zeros_like(s.param); }

  void update(Shard& s, const at::Tensor& grad) override {
    const Hyper& h = s.hyper;
    const double lr = num(h, "lr"), b1 = beta(h, 0), b2 = beta(h, 1);
    const double wd = num(h, "weight_decay");
    at::Tensor& p = s.param;
    at::Tensor& m = s.state.at("exp_avg");
    if (on_cpu_kernels()) {
      ops::cpu::LionArgs a;
      a.lr = lr;
      a.beta1 = b1;
      a.beta2 = b2;
      a.weight_decay = wd;
      ops::cpu::lion_step(cpu_tensors(p, grad), m, a);
      return;
    }
    at::Tensor c = m.mul(b1).add_(grad, 1 - b1);
    if (wd != 0) p.mul_(1 - lr * wd);
    p.add_(c.sign_(), -lr);
    m.mul_(b2).add_(grad, 1 - b2);
  }
};

// DeepSpeed's FusedLamb: Adam moments without bias correction in the update direction
// u = m / (sqrt(v) + eps) + wd*p, scaled by lr*sqrt(bc2)/bc1 and by the trust ratio
// ||p|| / ||u|| clamped to [min_coeff, max_coeff] (1 where either norm is 0).
class Lamb final : public Algorithm {
 public:
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  Lamb(const Hyper& params, bool ignore_unknown) : Algorithm("lamb", ignore_unknown) {
    configure(params);
  }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override {
    ParamReader r(given, path);
    Hyper h = start(given, strict);
    h["lr"] = r.number("lr", 1e-3, 0);
    h["bias_correction"] = r.flag("bias_correction", true);
    h["betas"] = r.betas("betas", {0.9, 0.999});
    h["eps"] = r.number("eps", 1e-8, 0);
    h["eps_inside_sqrt"] = r.flag("eps_inside_sqrt", false);
    h["weight_decay"] = r.number("weight_decay", 0, 0);
    h["max_coeff"] = r.number("max_coeff", 10.0);
    h["min_coeff"] = r.number("min_coeff", 0.01);
    if (r.has("segments")) h["segments"] = r.lengths("segments");
    r.must_be_false("amsgrad", "DeepSpeed's FusedLamb has no AMSGrad");
    finish(r, strict);
    return h;
  }

  void init_state(Shard& s) override {
    if (s.hyper.contains("segments")) {
      int64_t total = 0;
      for (const auto& n : s.hyper["segments"]) total += n.get<int64_t>();
      if (total != s.param.numel())
        throw ConfigError("optimizer.params.segments",
                          fmt::format("the segments add up to {} elements, the shard has {}", total,
                                      s.param.numel()));
    }
    s.state["exp_avg"] = at::zeros_like(s.param);
    s.state["exp_avg_sq"] = at::zeros_like(s.param);
  }

  void update(Shard& s, const at::Tensor& grad) override {
    const Hyper& h = s.hyper;
    const double lr = num(h, "lr"), b1 = beta(h, 0), b2 = beta(h, 1), eps = num(h, "eps");
    const double wd = num(h, "weight_decay");
    at::Tensor& p = s.param;
    at::Tensor& m = s.state.at("exp_avg");
    at::Tensor& v = s.state.at("exp_avg_sq");
    m.mul_(b1).add_(grad, 1 - b1);
    v.mul_(b2).addcmul_(grad, grad, 1 - b2);
    at::Tensor denom = flag(h, "eps_inside_sqrt") ? v.add(eps).sqrt_() : v.sqrt().add_(eps);
    at::Tensor u = m.div(denom);
    if (wd != 0) u.add_(p, wd);

    // DeepSpeed takes one trust ratio per parameter tensor. A ZeRO shard is a flat slice that
    // may hold several tensors (and parts of tensors), so without "segments" the whole shard
    // counts as one tensor; with "segments": [n1, n2, ...] (lengths summing to the shard's
    // size) each run of elements gets its own ratio, which gives DeepSpeed's per-tensor rule
    // wherever a shard's segments are whole tensors.
    std::vector<int64_t> lengths;
    if (h.contains("segments"))
      lengths = h["segments"].get<std::vector<int64_t>>();
    else
      lengths = {p.numel()};
    std::vector<at::Tensor> w_norms, u_norms;
    int64_t offset = 0;
    for (int64_t n : lengths) {
      w_norms.push_back(p.narrow(0, offset, n).norm());
      u_norms.push_back(u.narrow(0, offset, n).norm());
      offset += n;
    }
    at::Tensor w = at::stack(w_norms), un = at::stack(u_norms);
    at::Tensor ratio = at::where(w.ne(0).logical_and_(un.ne(0)),
                                 w.div(un).clamp_(num(h, "min_coeff"), num(h, "max_coeff")), 1.0);
    at::Tensor per_element;
    if (lengths.size() == 1) {
      per_element = ratio.expand({p.numel()});
    } else {
      at::Tensor repeats = at::empty({static_cast<int64_t>(lengths.size())}, at::kLong);
      std::copy(lengths.begin(), lengths.end(), repeats.data_ptr<int64_t>());
      per_element = at::repeat_interleave(ratio, repeats.to(p.device()), 0, p.numel());
    }
    const double step = static_cast<double>(s.steps);
    const double step_size = flag(h, "bias_correction")
                                 ? lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step))
                                 : lr;
    p.addcmul_(u, per_element, -step_size);
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config) {
  const std::string type = config::lower(config.type);
  const std::string path = "optimizer.params";
  Hyper params = config.params.is_null() ? Hyper::object() : config.params;
  if (!params.is_object()) throw ConfigError(path, "expected an object of parameters");
  if (params.contains("max_grad_norm"))
    throw ConfigError(path + ".max_grad_norm",
                      "is not an optimizer parameter (DeepSpeed rejects it too); use the "
                      "top-level \"gradient_clipping\"");
  // The 1-bit optimizers train as their plain counterparts here (ds_config reports that).
  const bool one_bit = type == "onebitadam" || type == "zerooneadam" || type == "onebitlamb";

  if (type == "adam" || type == "adamw" || type == "onebitadam" || type == "zerooneadam") {
    ParamReader r(params, path);
    // engine.py: the name "adamw" always decays decoupled; "adam" does unless adam_w_mode is
    // false (default true).
    const bool decoupled = r.flag("adam_w_mode", true) || type == "adamw";
    // torch_adam swaps in torch.optim.AdamW / Adam, whose weight_decay defaults differ.
    const bool torch_adam = r.flag("torch_adam", false);
    const double default_weight_decay = torch_adam && decoupled ? 1e-2 : 0.0;
    params.erase("adam_w_mode");
    params.erase("torch_adam");
    return std::make_unique<Adam>(type == "adamw" ? "adamw" : "adam", decoupled,
                                  default_weight_decay, params, one_bit);
  }
  if (type == "lamb" || type == "onebitlamb") return std::make_unique<Lamb>(params, one_bit);
  if (type == "sgd") return std::make_unique<SGD>(params);
  if (type == "lion") return std::make_unique<Lion>(params);
  if (type == "adagrad") return std::make_unique<Adagrad>(params);
  throw ConfigError("optimizer.type",
                    fmt::format("unknown optimizer '{}'; expected one of Adam, AdamW, Lamb, SGD, "
                                "Lion, Adagrad (or OneBitAdam, ZeroOneAdam, OneBitLamb)",
                                config.type));
}

}  // namespace dscpp::optim
