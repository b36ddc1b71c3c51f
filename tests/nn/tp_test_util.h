// Shared by the tensor-parallel tests (tp_*.cpp, one program run by N Gloo ranks): the model
// groups this rank belongs to, deterministic inputs that every rank draws alike, and the
// relative comparison against a float64 reference.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace tp_test {

// A model group: "t4 (world)" or "t2 of 2": every case runs on each that holds this rank.
struct ModelGroup {
  std::string name;
  dscpp::nn::GroupPtr group;
  int t() const { return group->size(); }
  int r() const { return group->rank(); }
};
const std::vector<ModelGroup>& model_groups();
const dscpp::nn::GroupPtr& world();

// normal(0, 1) samples of `sizes` from their own generator: the same on every rank.
inline at::Tensor draw(at::IntArrayRef sizes, uint64_t seed, at::ScalarType dtype = at::kDouble) {
  return at::randn(sizes, at::detail::createCPUGenerator(seed),
                   at::TensorOptions().dtype(at::kDouble))
      .to(dtype);
}

// Rank r's chunk of t along dim.
inline at::Tensor chunk(const at::Tensor& x, int64_t dim, const ModelGroup& g) {
  return x.chunk(g.t(), dim)[g.r()].contiguous();
}

// max |got - want| / max |want| <= tol: fp32 results against a float64 reference.
inline ::testing::AssertionResult rel_close(const at::Tensor& got, const at::Tensor& want,
                                            double tol = 1e-5) {
  if (!got.defined() || !want.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  const at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  const double scale = std::max(w.abs().max().item<double>(), 1e-30);
  const double err = (g - w).abs().max().item<double>() / scale;
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " > " << tol;
}

// Every rank's copy of x, stacked [t, ...], over the model group (for agree/differ checks).
inline at::Tensor gather_all(const at::Tensor& x, const ModelGroup& g) {
  auto sizes = x.sizes().vec();
  sizes.insert(sizes.begin(), g.t());
  at::Tensor out = at::empty({x.numel() * g.t()}, x.options());
  g.group->all_gather(out, x.contiguous().view(-1)).wait();
  return out.view(sizes);
}

}  // namespace tp_test
