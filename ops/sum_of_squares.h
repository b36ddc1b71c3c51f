// The sum of squares of a tensor's elements, as a 0-dim fp32 tensor on the tensor's device:
// ZeRO's local share of the gradient norm. On the CPU (an offloaded gradient partition, or CPU
// ranks) it reads 16-bit or fp32 elements in place, widening as it reads, summing in double,
// block by block on LibTorch's intra-op threads (ops/cpu_parallel.h), each block through the CPU
// kernels' loop for this CPU's instruction set (cpu_adam_kernels.h), then in block order, so
// the result does not depend on the thread count. (Not at::parallel_for: it is serial in a unit
// built without OpenMP, and one core sums 0.6-0.9 G bf16 elements/s, 5-8 s for a 4.64 B
// partition; docs/perf-log/2026-12-03.md.)
// ATen's vector norm with an fp32 dtype would first copy a 16-bit partition to fp32 (4 bytes a
// parameter of host memory, 18.6 GB at 4.64 B parameters, touched afresh every step) and sum
// it in fp32 (6% low at 2e8 N(0,1) elements). On a GPU ATen's reduction widens in its kernel.
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::ops {

at::Tensor sum_of_squares(const at::Tensor& t);
// The same sum of a CPU tensor, as the double it is summed in (before the fp32 rounding), for
// callers that add several (ZeRO-Offload's landings sum each bucket's chunk as it lands).
double host_sum_of_squares(const at::Tensor& t);

}  // namespace dscpp::ops
