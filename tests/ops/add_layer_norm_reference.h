// The residual add + LayerNorm written out in float64 on the CPU (the formulas, not
// torch's layer_norm), for the CPU and CUDA tests of ops::add_layer_norm: the statistics of the
// h given (the rounded one an op returned, or x + branch), and all three gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros_like.h>

namespace dscpp::ops::test {

struct AddLayerNormReference {
  at::Tensor y, dx, dweight, dbias;
};

// h: [..., n] as the op formed it; dh, dy: the incoming gradients (either undefined: zero).
inline AddLayerNormReference add_layer_norm_reference(const at::Tensor& h, const at::Tensor& weight,
                                                      const at::Tensor& bias, double eps,
                                                      const at::Tensor& dh, const at::Tensor& dy) {
  const auto f64 = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); };
  const int64_t n = h.size(-1);
  const at::Tensor h64 = f64(h).reshape({-1, n});
  const at::Tensor w = f64(weight), b = f64(bias);
  const at::Tensor mean = h64.mean({1}, /*keepdim=*/true);
  const at::Tensor centred = h64.sub(mean);
  const at::Tensor rstd = centred.pow(2).mean({1}, true).add(eps).rsqrt();
  const at::Tensor xhat = centred.mul(rstd);
  AddLayerNormReference r;
  r.y = xhat.mul(w).add(b).view(h.sizes());
  const at::Tensor gy = dy.defined() ? f64(dy).reshape({-1, n}) : at::zeros_like(h64);
  const at::Tensor g = gy.mul(w);
  at::Tensor dx = rstd.mul(g.sub(g.mean({1}, true)).sub(xhat.mul(g.mul(xhat).mean({1}, true))));
  if (dh.defined()) dx = dx.add(f64(dh).reshape({-1, n}));
  r.dx = dx.view(h.sizes());
  r.dweight = gy.mul(xhat).sum({0});
  r.dbias = gy.sum({0});
  return r;
}

}  // namespace dscpp::ops::test
