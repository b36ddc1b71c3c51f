// Muon on ZeRO's shards (muon.h).
#include "dscpp/optim/muon.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dscpp/config/section.h"
#include "dscpp/optim/muon_update.h"
#include "dscpp/optim/muonh_update.h"
#include "dscpp/optim/param_reader.h"

namespace dscpp::optim {

Muon::Muon(const Hyper& params, Rule rule) : Optimizer(Hyper::object()), rule_(rule) {
  defaults_ = resolve(params, "optimizer.params", true);
}

Hyper Muon::resolve(const Hyper& given, const std::string& path, bool strict) const {
  ParamReader r(given, path);
  Hyper h = strict ? Hyper::object() : given;
  h["lr"] = r.number("lr", 0.02, 0);
  if (rule_ == Rule::Hyperball) {
    h["momentum"] = r.number("momentum", 0.95, 0, 1);
    h["nesterov"] = r.flag("nesterov", true);
    h["backend_steps"] = r.number("backend_steps", 5, 1);
    h["muon_epsilon"] = r.number("muon_epsilon", 1e-8, 0);
    const std::string c = r.text("coefficient_type", "quintic");
    if (c != "quintic" && c != "simple") r.fail("coefficient_type", "\"quintic\" or \"simple\"");
    h["coefficient_type"] = c;
    if (strict) r.finish();
    return h;
  }
  h["momentum"] = r.number("momentum", 0.95, 0, 1);
  h["weight_decay"] = r.number("weight_decay", 0, 0);
  const std::string method = r.text("ns_method", "gram");
  if (method != "gram" && method != "standard") r.fail("ns_method", "\"gram\" or \"standard\"");
  h["ns_method"] = method;
  if (strict) r.finish();
  return h;
}

void Muon::set_shard_params(int shard, std::vector<ShardParam> params) {
  if (shard < 0 || shard >= num_shards())
    throw MuonError(fmt::format("Muon: no shard {} (it has {})", shard, num_shards()));
  const int64_t size = shards_[shard].param.numel();
  for (const auto& p : params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    if (p.shape.size() < 2 || p.offset < 0 || p.offset + numel > size)
      throw MuonError(fmt::format(
          "Muon: a parameter of shape [{}] at {} does not lie whole in shard {} of {} elements, "
          "or is not a matrix",
          fmt::join(p.shape, ", "), p.offset, shard, size));
  }
  if (static_cast<int>(params_.size()) < num_shards()) {
    params_.resize(num_shards());
    described_.resize(num_shards(), 0);
  }
  params_[shard] = std::move(params);
  described_[shard] = 1;
}

void Muon::init_state(Shard& s) {
  s.state["momentum_buffer"] = at::zeros_like(s.param);
}

void Muon::update(Shard& s, const at::Tensor& grad) {
  const int index = static_cast<int>(&s - shards_.data());
  const bool described =
      index >= 0 && index < static_cast<int>(described_.size()) && described_[index];
  if (!described) {
    // (update_range and update_detached pass views: Muon is not elementwise, so ZeRO steps it
    // whole, shard by shard.)
    if (s.param.numel() == 0) return;
    throw MuonError(
        "Muon: a shard's matrices were not given (set_shard_params): Muon orthogonalises each "
        "matrix whole, so its parameters must lie whole in the shards it steps");
  }
  const Hyper& h = s.hyper;
  if (rule_ == Rule::Hyperball) return update_hyperball(s, index, grad);
  const double lr = h.at("lr").get<double>(), wd = h.at("weight_decay").get<double>();
  MuonUpdateOptions o;
  o.beta = h.at("momentum").get<double>();
  o.method = ns_method_from(h.at("ns_method").get<std::string>());
  at::Tensor& momentum = s.state.at("momentum_buffer");
  for (const auto& p : params_[index]) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    // muon_update blends Nesterov's momentum into the gradient in place: one fp32 copy, not
    // the caller's partition.
    at::Tensor g = grad.narrow(0, p.offset, numel).view(p.shape).to(at::kFloat, false, true);
    at::Tensor m = momentum.narrow(0, p.offset, numel).view(p.shape);
    // Offloaded: the matrix to the training device and back (its momentum in place after).
    const at::Tensor held = m;
    const bool moved = compute_device_ && *compute_device_ != m.device();
    if (moved) {
      g = g.to(*compute_device_);
      m = m.to(*compute_device_);
    }
    o.expert_group = p.shape.size() == 3;
    at::Tensor u;
    if (p.whole_of) {
      // A tensor-parallel slice: the whole matrix's momentum and update, as one rank computes
      // them (orthogonalising each slice on its own would be another update), then this
      // rank's slice of each. Every model rank orthogonalises the same whole matrix.
      at::Tensor whole_g = p.whole_of(g), whole_m = p.whole_of(m);
      u = p.part_of(muon_update(whole_g, whole_m, o));
      m.copy_(p.part_of(whole_m));
    } else {
      u = muon_update(g, m, o);
    }
    if (moved) {
      held.copy_(m);
      u = u.to(held.device());
    }
    ++orthogonalised_;
    at::Tensor w = s.param.narrow(0, p.offset, numel);
    if (wd != 0) w.mul_(1 - lr * wd);
    w.add_(u.reshape({numel}).to(w.scalar_type()), -lr);
  }
}

void Muon::update_hyperball(Shard& s, int index, const at::Tensor& grad) {
  const Hyper& h = s.hyper;
  MuonHOptions o;
  o.momentum = h.at("momentum").get<double>();
  o.nesterov = h.at("nesterov").get<bool>();
  o.steps = static_cast<int>(h.at("backend_steps").get<double>());
  o.eps = h.at("muon_epsilon").get<double>();
  o.coefficients = h.at("coefficient_type").get<std::string>();
  const double lr = h.at("lr").get<double>();
  at::Tensor& momentum = s.state.at("momentum_buffer");
  for (const auto& p : params_[index]) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    at::Tensor w = s.param.narrow(0, p.offset, numel).view(p.shape);
    at::Tensor m = momentum.narrow(0, p.offset, numel).view(p.shape);
    at::Tensor g = grad.narrow(0, p.offset, numel).view(p.shape);
    // Offloaded: the matrix, its momentum and its gradient on the training device and back.
    const bool moved = compute_device_ && *compute_device_ != w.device();
    at::Tensor wc = moved ? w.to(*compute_device_) : w, mc = moved ? m.to(*compute_device_) : m;
    const at::Tensor gc = moved ? g.to(*compute_device_) : g;
    if (p.whole_of) {
      // A tensor-parallel slice: the hyperball's norms are the whole matrix's, so every model
      // rank steps the whole matrix as one rank does and keeps its slices.
      at::Tensor whole_w = p.whole_of(wc), whole_m = p.whole_of(mc);
      muonh_step(whole_w, whole_m, p.whole_of(gc), lr, o);
      wc.copy_(p.part_of(whole_w));
      mc.copy_(p.part_of(whole_m));
    } else {
      muonh_step(wc, mc, gc, lr, o);
    }
    if (moved) {
      w.copy_(wc);
      m.copy_(mc);
    }
    ++orthogonalised_;
  }
}

bool is_muon(const OptimizerConfig& config) {
  const std::string type = config::lower(config.type);
  return type == "muon" || type == "muonh";
}

namespace {

// Marin's MuonH (Levanter's MuonHConfig's names and defaults): the matrices' half, and Adam
// without weight decay at adam_lr for the rest.
MuonHalves make_muonh_halves(const Hyper& params) {
  ParamReader r(params, "optimizer.params");
  Hyper muon = Hyper::object(), adam = Hyper::object();
  // The matrices' keys go to the Muon half as given: its resolve gives their defaults and
  // checks them (under the same path).
  for (const char* key :
       {"lr", "momentum", "nesterov", "backend_steps", "muon_epsilon", "coefficient_type"})
    if (r.has(key)) muon[key] = params.at(key);
  r.tolerate({"lr", "momentum", "nesterov", "backend_steps", "muon_epsilon", "coefficient_type"});
  adam["lr"] = r.number("adam_lr", 6e-4, 0);
  adam["betas"] = Hyper::array({r.number("beta1", 0.9, 0, 1), r.number("beta2", 0.95, 0, 1)});
  adam["eps"] = r.number("epsilon", 1e-8, 0);
  adam["weight_decay"] = 0.0;
  r.finish();
  MuonHalves h;
  h.muon = std::make_unique<Muon>(muon, Muon::Rule::Hyperball);
  h.adam = make_optimizer(OptimizerConfig{"adam", adam});
  return h;
}

}  // namespace

MuonHalves make_muon_halves(const OptimizerConfig& config) {
  const Hyper params = config.params.is_null() ? Hyper::object() : config.params;
  if (config::lower(config.type) == "muonh") return make_muonh_halves(params);
  ParamReader r(params, "optimizer.params");
  r.must_be_false("per_head_muon", "per-head Newton-Schulz for attention is not implemented");
  Hyper muon = Hyper::object(), adam = Hyper::object();
  // (Muon's constructor checks ns_method's value and names it.)
  muon["momentum"] = r.number("momentum", 0.95, 0, 1);
  muon["ns_method"] = r.text("ns_method", "gram");
  adam["betas"] = r.betas("betas", {0.9, 0.95});
  adam["eps"] = r.number("eps", 1e-10, 0);
  const double wd = r.number("weight_decay", 0, 0);
  muon["weight_decay"] = adam["weight_decay"] = wd;
  const std::optional<double> lr = r.optional_number("lr", 0);
  muon["lr"] = r.number("muon_lr", lr.value_or(0.02), 0);
  adam["lr"] = r.number("adam_lr", lr.value_or(3e-4), 0);
  adam["adam_w_mode"] = r.flag("adam_w_mode", true);
  r.finish();
  MuonHalves h;
  h.muon = std::make_unique<Muon>(muon);
  h.adam = make_optimizer(OptimizerConfig{"adam", adam});
  return h;
}

}  // namespace dscpp::optim
