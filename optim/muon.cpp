// Muon on ZeRO's shards (muon.h).
#include "dscpp/optim/muon.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dscpp/optim/muon_update.h"
#include "dscpp/optim/param_reader.h"

namespace dscpp::optim {

Muon::Muon(const Hyper& params) : Optimizer(Hyper::object()) {
  defaults_ = resolve(params, "optimizer.params", true);
}

Hyper Muon::resolve(const Hyper& given, const std::string& path, bool strict) const {
  ParamReader r(given, path);
  Hyper h = strict ? Hyper::object() : given;
  h["lr"] = r.number("lr", 0.02, 0);
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
  const double lr = h.at("lr").get<double>(), wd = h.at("weight_decay").get<double>();
  MuonUpdateOptions o;
  o.beta = h.at("momentum").get<double>();
  o.method = ns_method_from(h.at("ns_method").get<std::string>());
  at::Tensor& momentum = s.state.at("momentum_buffer");
  for (const auto& p : params_[index]) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    // muon_update blends Nesterov's momentum into the gradient in place: a copy, not the
    // caller's partition.
    at::Tensor g = grad.narrow(0, p.offset, numel).to(at::kFloat).view(p.shape).clone();
    at::Tensor m = momentum.narrow(0, p.offset, numel).view(p.shape);
    o.expert_group = p.shape.size() == 3;
    const at::Tensor u = muon_update(g, m, o);
    ++orthogonalised_;
    at::Tensor w = s.param.narrow(0, p.offset, numel);
    if (wd != 0) w.mul_(1 - lr * wd);
    w.add_(u.reshape({numel}).to(w.scalar_type()), -lr);
  }
}

}  // namespace dscpp::optim
