// op_cost: one formula per operator family, looked up by the operator's name (op_flops.h).
#include "dscpp/runtime/profiler/op_flops.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace dscpp::profiler {

namespace {

using Inputs = c10::ArrayRef<const c10::IValue>;
using Formula = OpCost (*)(Inputs);

// Input i as a defined tensor, or nullptr.
const at::Tensor* tensor_at(Inputs in, size_t i) {
  if (i >= in.size() || !in[i].isTensor()) return nullptr;
  const at::Tensor& t = in[i].toTensor();
  return t.defined() ? &t : nullptr;
}

std::vector<int64_t> ints_at(Inputs in, size_t i) {
  if (i < in.size() && in[i].isIntList()) return in[i].toIntVector();
  if (i < in.size() && in[i].isInt()) return {in[i].toInt()};
  return {};
}

int64_t int_at(Inputs in, size_t i, int64_t otherwise) {
  return i < in.size() && in[i].isInt() ? in[i].toInt() : otherwise;
}

// A list argument of one value per spatial dimension, given once for all (PyTorch expands it).
int64_t per_dim(const std::vector<int64_t>& v, size_t d, int64_t otherwise) {
  if (v.empty()) return otherwise;
  return v.size() == 1 ? v[0] : (d < v.size() ? v[d] : otherwise);
}

// Elements of the broadcast of a and b, aligned from the trailing dimension.
int64_t broadcast_numel(c10::IntArrayRef a, c10::IntArrayRef b) {
  const size_t n = std::max(a.size(), b.size());
  int64_t p = 1;
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    p *= std::max(x, y);
  }
  return p;
}

OpCost products(int64_t macs) {
  return {2 * macs, macs};
}

// F.linear: input [..., in] by weight [out, in]; the bias is not counted.
OpCost linear(Inputs in) {
  const at::Tensor* x = tensor_at(in, 0);
  const at::Tensor* w = tensor_at(in, 1);
  if (!x || !w || w->dim() < 1) return {};
  return products(x->numel() * w->size(0));
}

// matmul, mm, bmm: a [..., m, k] by b [..., k, n] over the broadcast batch (DeepSpeed's
// numel(a) * n where the batch is a's).
OpCost matmul(Inputs in) {
  const at::Tensor* a = tensor_at(in, 0);
  const at::Tensor* b = tensor_at(in, 1);
  if (!a || !b || a->dim() == 0 || b->dim() == 0) return {};
  if (b->dim() == 1) return products(a->numel());  // matrix (or vector) times vector
  if (a->dim() == 1) return products(b->numel());  // vector times matrix
  const int64_t m = a->size(-2), k = a->size(-1), n = b->size(-1);
  const int64_t batch =
      broadcast_numel(a->sizes().slice(0, a->dim() - 2), b->sizes().slice(0, b->dim() - 2));
  return products(batch * m * k * n);
}

// _grouped_mm(a, b, offs, ...): the groups' products over every row a holds (the MoE
// permutation's padding rows too: they are the dropped routes, and DeepSpeed's capacity einsum
// counts its padded rows as well). a [M, K] by b [G, K, N] (each row in one group), a [K, M] by
// b [M, N] (the weights' gradient: G outputs over the M rows in all) and a [G, M, K] by b
// [G, K, N] all come to a's elements times N; a [G, M, K] by b [K, N] groups N: M*K*N.
OpCost grouped_product(Inputs in) {
  const at::Tensor* a = tensor_at(in, 0);
  const at::Tensor* b = tensor_at(in, 1);
  if (!a || !b || a->dim() < 2 || b->dim() < 2) return {};
  if (a->dim() == 3 && b->dim() == 2) return products(a->size(1) * a->size(2) * b->size(1));
  return products(a->numel() * b->size(-1));
}

// addmm(input, m1, m2) and baddbmm(input, b1, b2): the product and one flop per element of
// the added input, as DeepSpeed counts them.
OpCost add_product(Inputs in) {
  const at::Tensor* self = tensor_at(in, 0);
  const at::Tensor* m1 = tensor_at(in, 1);
  const at::Tensor* m2 = tensor_at(in, 2);
  if (!m1 || !m2 || m2->dim() < 1) return {};
  OpCost c = products(m1->numel() * m2->size(-1));
  if (self) c.flops += self->numel();
  return c;
}

// Attention: q k^T over all key positions, then the weighted sum of v. key_dim: the key
// sequence's dimension (-2 for [B, H, S, D], 1 for the flash kernels' [B, S, H, D]).
OpCost attention(Inputs in, int64_t key_dim) {
  const at::Tensor* q = tensor_at(in, 0);
  const at::Tensor* k = tensor_at(in, 1);
  const at::Tensor* v = tensor_at(in, 2);
  if (!q || !k || !v || q->dim() < 2 || k->dim() < 2 || v->dim() < 1) return {};
  const int64_t keys = k->size(key_dim);
  const int64_t rows = q->numel() / std::max<int64_t>(1, q->size(-1));
  return products(q->numel() * keys + rows * keys * v->size(-1));
}
OpCost sdpa(Inputs in) {
  return attention(in, -2);
}
OpCost flash_kernel(Inputs in) {
  return attention(in, 1);
}

// One flop per element of the broadcast of the first two arguments' tensors (a scalar
// operand counts as nothing): elementwise arithmetic, activations, softmax, reductions.
OpCost elementwise(Inputs in) {
  const at::Tensor* a = tensor_at(in, 0);
  const at::Tensor* b = tensor_at(in, 1);
  if (a && b) return {broadcast_numel(a->sizes(), b->sizes()), 0};
  if (a) return {a->numel(), 0};
  if (b) return {b->numel(), 0};
  return {};
}

OpCost nothing(Inputs) {
  return {};
}

// Normalisations, DeepSpeed's estimate: 5 flops per element with an affine weight, 4 without.
OpCost norm_with_weight_at(Inputs in, size_t weight) {
  const at::Tensor* x = tensor_at(in, 0);
  if (!x) return {};
  return {x->numel() * (tensor_at(in, weight) ? 5 : 4), 0};
}
OpCost layer_norm(Inputs in) {
  return norm_with_weight_at(in, 2);
}  // (x, shape, w, b, ...)
OpCost group_norm(Inputs in) {
  return norm_with_weight_at(in, 2);
}  // (x, groups, w, b, ...)
OpCost instance_norm(Inputs in) {
  return norm_with_weight_at(in, 1);
}

// batch_norm(x, weight, bias, running_mean, running_var, training, ...).
OpCost batch_norm(Inputs in) {
  const at::Tensor* x = tensor_at(in, 0);
  if (!x) return {};
  const bool affine = tensor_at(in, 1) != nullptr;
  const bool training = in.size() > 5 && in[5].isBool() && in[5].toBool();
  if (training) return {x->numel() * (affine ? 5 : 4), 0};
  return {x->numel() * (affine ? 2 : 1), 0};
}

// Our fused bias add and GELU: one flop each per element.
OpCost bias_gelu(Inputs in) {
  const at::Tensor* x = tensor_at(in, 0);
  return x ? OpCost{2 * x->numel(), 0} : OpCost{};
}

// Our fused residual add and LayerNorm (x, branch, weight, bias): the add's one flop per
// element and layer_norm's five.
OpCost add_layer_norm(Inputs in) {
  const at::Tensor* x = tensor_at(in, 0);
  return x ? OpCost{6 * x->numel(), 0} : OpCost{};
}

// Convolution over input [B, C_in, *spatial] with weight [C_out, C_in / groups, *kernel]
// (transposed: [C_in, C_out / groups, *kernel]), DeepSpeed's formulas: 2 flops per MAC plus
// the bias over the output.
struct ConvArgs {
  std::vector<int64_t> stride, padding, dilation, output_padding;
  bool same = false, transposed = false;
  int64_t groups = 1;
};

OpCost conv(Inputs in, const ConvArgs& a) {
  const at::Tensor* x = tensor_at(in, 0);
  const at::Tensor* w = tensor_at(in, 1);
  if (!x || !w || x->dim() < 3 || w->dim() != x->dim()) return {};
  const int64_t batch = x->size(0), in_channels = x->size(1);
  const size_t dims = static_cast<size_t>(x->dim() - 2);
  int64_t kernel = 1, input_positions = 1, output_positions = 1;
  for (size_t d = 0; d < dims; ++d) {
    const int64_t k = w->size(static_cast<int64_t>(d) + 2);
    const int64_t size = x->size(static_cast<int64_t>(d) + 2);
    const int64_t s = per_dim(a.stride, d, 1), dil = per_dim(a.dilation, d, 1);
    const int64_t p = a.same ? dil * (k - 1) / 2 : per_dim(a.padding, d, 0);
    kernel *= k;
    input_positions *= size;
    output_positions *=
        a.transposed ? (size - 1) * s - 2 * p + dil * (k - 1) + per_dim(a.output_padding, d, 0) + 1
                     : (size + 2 * p - (dil * (k - 1) + 1)) / s + 1;
  }
  const int64_t groups = std::max<int64_t>(1, a.groups);
  int64_t macs = 0, out_channels = 0;
  if (a.transposed) {
    out_channels = w->size(1) * groups;
    macs = kernel * in_channels * w->size(1) * batch * input_positions;
  } else {
    out_channels = w->size(0);
    macs = kernel * in_channels * (out_channels / groups) * batch * output_positions;
  }
  const int64_t bias = tensor_at(in, 2) ? out_channels * batch * output_positions : 0;
  return {2 * macs + bias, macs};
}

// conv1d/2d/3d(x, w, b, stride, padding, dilation, groups); padding may be "same"/"valid".
OpCost conv_nd(Inputs in) {
  ConvArgs a;
  a.stride = ints_at(in, 3);
  if (in.size() > 4 && in[4].isString()) {
    a.same = in[4].toStringRef() == "same";
  } else {
    a.padding = ints_at(in, 4);
  }
  a.dilation = ints_at(in, 5);
  a.groups = int_at(in, 6, 1);
  return conv(in, a);
}

// convolution / _convolution(x, w, b, stride, padding, dilation, transposed, output_padding,
// groups, ...).
OpCost convolution(Inputs in) {
  ConvArgs a;
  a.stride = ints_at(in, 3);
  a.padding = ints_at(in, 4);
  a.dilation = ints_at(in, 5);
  a.transposed = in.size() > 6 && in[6].isBool() && in[6].toBool();
  a.output_padding = ints_at(in, 7);
  a.groups = int_at(in, 8, 1);
  return conv(in, a);
}

// conv_transpose1d/2d/3d(x, w, b, stride, padding, output_padding, groups, dilation).
OpCost conv_transpose(Inputs in) {
  ConvArgs a;
  a.transposed = true;
  a.stride = ints_at(in, 3);
  a.padding = ints_at(in, 4);
  a.output_padding = ints_at(in, 5);
  a.groups = int_at(in, 6, 1);
  a.dilation = ints_at(in, 7);
  return conv(in, a);
}

const std::unordered_map<std::string, Formula>& formulas() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, Formula>{
        {"aten::linear", linear},
        {"dscpp::linear", linear},
        {"dscpp::fp8_linear", linear},  // its own name: the profile shows fp8 products apart
        {"aten::matmul", matmul},
        {"aten::mm", matmul},
        {"aten::bmm", matmul},
        {"aten::addmm", add_product},
        {"aten::baddbmm", add_product},
        {"aten::_grouped_mm", grouped_product},
        {"aten::scaled_dot_product_attention", sdpa},
        {"aten::_scaled_dot_product_attention_math", sdpa},
        {"aten::_scaled_dot_product_flash_attention", sdpa},
        {"aten::_scaled_dot_product_flash_attention_for_cpu", sdpa},
        {"aten::_scaled_dot_product_efficient_attention", sdpa},
        {"aten::_scaled_dot_product_cudnn_attention", sdpa},
        {"aten::_scaled_dot_product_fused_attention_overrideable", sdpa},
        {"aten::_flash_attention_forward", flash_kernel},
        {"aten::_efficient_attention_forward", flash_kernel},
        {"aten::conv1d", conv_nd},
        {"aten::conv2d", conv_nd},
        {"aten::conv3d", conv_nd},
        {"aten::convolution", convolution},
        {"aten::_convolution", convolution},
        {"aten::conv_transpose1d", conv_transpose},
        {"aten::conv_transpose2d", conv_transpose},
        {"aten::conv_transpose3d", conv_transpose},
        {"aten::layer_norm", layer_norm},
        {"aten::native_layer_norm", layer_norm},
        {"aten::rms_norm", layer_norm},
        {"aten::group_norm", group_norm},
        {"aten::native_group_norm", nothing},  // its group_norm counts; called alone, rare
        {"aten::instance_norm", instance_norm},
        {"aten::batch_norm", batch_norm},
        {"dscpp::bias_gelu", bias_gelu},
        {"dscpp::add_layer_norm", add_layer_norm},
        {"dscpp::cross_entropy", elementwise},  // its log-softmax over the logits
        {"dscpp::swiglu", elementwise},         // silu and the product: 2 per output, x's numel
        {"aten::cross_entropy_loss", elementwise},
        {"aten::dropout", nothing},
        {"aten::dropout_", nothing},
        {"aten::native_dropout", nothing},
        {"aten::feature_dropout", nothing},
        {"aten::alpha_dropout", nothing},
        {"aten::embedding", nothing},
        {"aten::embedding_bag", nothing},
        {"aten::_embedding_bag", nothing},
    };
    for (const char* op : {"add",
                           "add_",
                           "sub",
                           "sub_",
                           "rsub",
                           "mul",
                           "mul_",
                           "div",
                           "div_",
                           "pow",
                           "pow_",
                           "maximum",
                           "minimum",
                           "relu",
                           "relu_",
                           "gelu",
                           "gelu_",
                           "silu",
                           "silu_",
                           "elu",
                           "elu_",
                           "leaky_relu",
                           "leaky_relu_",
                           "prelu",
                           "relu6",
                           "hardtanh",
                           "hardtanh_",
                           "hardswish",
                           "mish",
                           "softplus",
                           "sigmoid",
                           "sigmoid_",
                           "tanh",
                           "tanh_",
                           "exp",
                           "exp_",
                           "log",
                           "erf",
                           "sqrt",
                           "rsqrt",
                           "neg",
                           "abs",
                           "reciprocal",
                           "softmax",
                           "_softmax",
                           "log_softmax",
                           "_log_softmax",
                           "sum",
                           "mean",
                           "amax",
                           "amin",
                           "max",
                           "min",
                           "prod",
                           "norm",
                           "linalg_vector_norm",
                           "var",
                           "std",
                           "logsumexp",
                           "avg_pool1d",
                           "avg_pool2d",
                           "avg_pool3d",
                           "max_pool1d",
                           "max_pool2d",
                           "max_pool3d",
                           "adaptive_avg_pool1d",
                           "adaptive_avg_pool2d",
                           "adaptive_avg_pool3d",
                           "adaptive_max_pool1d",
                           "adaptive_max_pool2d",
                           "adaptive_max_pool3d"})
      t->emplace(std::string("aten::") + op, elementwise);
    return t;
  }();
  return *table;
}

}  // namespace

bool has_formula(std::string_view name) {
  return formulas().count(std::string(name)) != 0;
}

std::optional<OpCost> op_cost(std::string_view name, c10::ArrayRef<const c10::IValue> inputs) {
  const auto& table = formulas();
  auto it = table.find(std::string(name));
  if (it == table.end()) return std::nullopt;
  return it->second(inputs);
}

}  // namespace dscpp::profiler
