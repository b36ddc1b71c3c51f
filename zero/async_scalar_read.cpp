// AsyncScalarRead: see async_scalar_read.h.
#include "dscpp/zero/async_scalar_read.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {

struct AsyncScalarRead::State {
  at::Tensor host;                   // pinned on a GPU's host, reused by every read
  std::optional<c10::Event> copied;  // none on the CPU: the copy is done when start() returns
  bool pending = false;
};

AsyncScalarRead::AsyncScalarRead() : state_(std::make_unique<State>()) {}
AsyncScalarRead::~AsyncScalarRead() = default;

void AsyncScalarRead::start(const at::Tensor& value) {
  if (value.numel() != 1 || value.scalar_type() != at::kDouble)
    throw dscpp::Error("AsyncScalarRead: the value must be one float64 element");
  State& s = *state_;
  const c10::Device device = value.device();
  if (device.is_cpu()) {
    s.host = value.clone();
    s.copied.reset();
  } else {
    if (!s.host.defined() || !s.host.is_pinned())
      s.host = at::empty({}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    s.host.copy_(value.reshape({}), /*non_blocking=*/true);
    if (!s.copied || s.copied->device_type() != device.type()) s.copied.emplace(device.type());
    s.copied->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  }
  s.pending = true;
}

double AsyncScalarRead::read() {
  State& s = *state_;
  if (!s.pending) throw dscpp::Error("AsyncScalarRead: read() without start()");
  if (s.copied) s.copied->synchronize();
  s.pending = false;
  return s.host.item<double>();
}

}  // namespace dscpp::zero
