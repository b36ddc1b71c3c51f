// Fused, differentiable elementwise ops for the GPT's memory-bound paths: one CUDA kernel
// each where eager LibTorch launches several, and the same maths in ATen everywhere else.
//
// Which path runs: the CUDA kernels when the build has CUDA (DSCPP_CUDA), the tensors are on
// a CUDA device and their dtypes are bf16, fp16 or fp32 as stated per op; otherwise an ATen
// composition of the same forward and backward formulas (CPU, float64, mixed dtypes). Both
// paths sit behind one autograd Function, so the gradient wiring is the same on every device.
// Kernels run on the current CUDA stream of the tensors' device and never synchronise the host.
// Backward is not itself differentiable (no double backward through the kernels).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace dscpp::ops {

// gelu(x + bias), torch.nn.functional.gelu's erf form, or its tanh form when
// tanh_approximation (approximate="tanh"). x: [..., n]; bias: [n]. The kernel runs when x and
// bias share a dtype among bf16, fp16, fp32; the sum x + bias is formed in fp32 and not rounded
// to x's dtype before the gelu (eager rounds it, so bf16 results differ by a rounding).
// Output: x's shape and dtype (the ATen path: the promoted dtype of x and bias).
// Backward: dx in x's dtype; dbias = dx summed over all rows with fp32 accumulation (of the
// unrounded dx), in bias's dtype. Saved for backward: x and the bias tensor itself (not a view
// or copy), so a bias whose storage is swapped by set_data between forward and backward (ZeRO
// stage 3 releasing and re-gathering parameters) is read as it is at backward time.
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh_approximation);

// torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index) with
// reduction="mean": the mean over rows whose target is not ignore_index of
// logsumexp(logits[i]) - logits[i, targets[i]]; NaN when every row is ignored (0 / 0, as
// PyTorch). logits: [N, V] (made contiguous if it is not); targets: [N] int64 on its device.
// The kernel runs for bf16, fp16 and fp32 logits; it reads each row once (online max and sum
// of exponentials, fp32) and keeps N fp32 log-sum-exps for backward, never fp32 logits.
// Returns a 0-d fp32 tensor (fp64 for fp64 logits, on the ATen path).
// Backward: grad_logits = (softmax(logits) - onehot(target)) * grad / count, computed in fp32
// per element and written once in logits' dtype into a fresh tensor; ignored rows get zeros.
// A target outside [0, V) that is not ignore_index throws on the ATen path and makes the
// kernel's loss NaN (a check would cost a device-to-host synchronisation).
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index = -100);

// The attention's q, k and v from the fused projection's output: qkv [B, S, 3h] (the last
// dimension laid out as [3, heads, h / heads]) gives three [B, heads, S, h / heads] views
// of it, no copy, the strides scaled_dot_product_attention takes. Backward writes the three
// gradients straight into one contiguous [B, S, 3h] gradient (three strided copies); the
// eager composition (view, permute, unbind) stacks them in one copy and makes the stack
// contiguous in a second, both at a fraction of the memory bandwidth (a GPT-1.3B step spent
// about 10 ms of 139 there on one H200, docs/perf-log/2026-12-01.md). An undefined gradient (an
// output unused) counts as zeros. The views may not be modified in place.
std::array<at::Tensor, 3> qkv_heads(const at::Tensor& qkv, int64_t heads);

// The residual add and the LayerNorm after it, in one pass: h = x + branch and
// y = torch.nn.functional.layer_norm(h, [n], weight, bias, eps); returns {h, y}. x, branch:
// [..., n] of one shape; weight, bias: [n]. The kernel runs when all four share a dtype among
// bf16, fp16, fp32; h is rounded to that dtype and the statistics (fp32, biased variance) are
// those of the rounded h, as eager's add then layer_norm give. It reads x and branch and writes
// h and y: four tensors' traffic, against eager's seven (the add's three, layer_norm's two, and
// h read again by layer_norm's backward and its weight-gradient kernel, see backward).
// Backward takes the gradients of h and y (either may be unused) and gives dx = dh +
// dLayerNorm(dy), the gradient of both x and branch, and dweight, dbias (fp32 sums, in
// weight's dtype): one kernel reads dy, dh, h and writes dx (eager: the layer_norm backward,
// its weight-gradient pass, and the add accumulating the two gradients of h). Saved: h, fp32
// mean and rstd per row, and weight and bias themselves (read at backward time, as bias_gelu).
std::array<at::Tensor, 2> add_layer_norm(const at::Tensor& x, const at::Tensor& branch,
                                         const at::Tensor& weight, const at::Tensor& bias,
                                         double eps);

// SwiGLU on a fused gate-and-up projection: silu(x[..., :f]) * x[..., f:] for x [..., 2f]
// (gate then up, model_zoo's and the MoE experts' layout), [..., f] in x's dtype. The kernel
// (bf16, fp16, fp32) reads x once and writes y once, computing in fp32 and rounding once
// (eager rounds silu(gate) before the product, so bf16 results differ by a rounding); eager
// runs two strided kernels. Backward gives dx [..., 2f] from the saved x in one kernel, each
// half written in place: eager's chunk, silu and mul backward write both halves' gradients
// and then copy them into one tensor (or, from narrow, into two zero-filled ones and add).
at::Tensor swiglu(const at::Tensor& x);

}  // namespace dscpp::ops
