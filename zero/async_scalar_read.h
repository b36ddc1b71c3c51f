// Reads one value of a 0-dim tensor on the host without draining the device's queue behind
// it: start() queues the copy into pinned memory on the current stream and marks the point;
// work queued after start() may run on while read() waits for that point alone. On the CPU
// both are immediate. One read in flight at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

namespace dscpp::zero {

class AsyncScalarRead {
 public:
  AsyncScalarRead();
  ~AsyncScalarRead();
  void start(const at::Tensor& value);  // a 0-dim float64 tensor
  double read();                        // waits for the copy start() queued

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dscpp::zero
