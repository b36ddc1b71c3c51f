// Activation metadata: see activation_meta.h. Layout: [count, then per tensor: dtype,
// requires_grad, ndim, dims...].
#include "dscpp/pipe/activation_meta.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/error.h"

namespace dscpp::pipe {

ActivationMeta meta_of(const nn::Activation& a) {
  ActivationMeta meta;
  for (const auto& t : a) {
    if (!t.defined()) throw Error("pipeline: a stage's output holds an undefined tensor");
    meta.push_back({t.sizes().vec(), t.scalar_type(), t.requires_grad()});
  }
  return meta;
}

at::Tensor encode_meta(const ActivationMeta& meta, at::Device device) {
  std::vector<int64_t> v{static_cast<int64_t>(meta.size())};
  for (const auto& m : meta) {
    v.push_back(static_cast<int64_t>(m.dtype));
    v.push_back(m.requires_grad ? 1 : 0);
    v.push_back(static_cast<int64_t>(m.shape.size()));
    v.insert(v.end(), m.shape.begin(), m.shape.end());
  }
  if (static_cast<int64_t>(v.size()) > kMetaLength)
    throw Error(fmt::format(
        "pipeline: an activation of {} tensors needs {} metadata elements, more than the {} a "
        "stage link carries",
        meta.size(), v.size(), kMetaLength));
  v.resize(kMetaLength, 0);
  return at::tensor(v, at::kLong).to(device);
}

ActivationMeta decode_meta(const at::Tensor& encoded) {
  at::Tensor t = encoded.to(at::kCPU).contiguous();
  const int64_t* v = t.data_ptr<int64_t>();
  ActivationMeta meta(static_cast<size_t>(v[0]));
  int64_t at_ = 1;
  for (auto& m : meta) {
    m.dtype = static_cast<at::ScalarType>(v[at_++]);
    m.requires_grad = v[at_++] != 0;
    const int64_t ndim = v[at_++];
    m.shape.assign(v + at_, v + at_ + ndim);
    at_ += ndim;
  }
  return meta;
}

nn::Activation allocate(const ActivationMeta& meta, at::Device device, bool grads_only) {
  nn::Activation out;
  for (const auto& m : meta)
    if (!grads_only || m.requires_grad)
      out.push_back(at::empty(m.shape, at::TensorOptions().dtype(m.dtype).device(device)));
  return out;
}

}  // namespace dscpp::pipe
