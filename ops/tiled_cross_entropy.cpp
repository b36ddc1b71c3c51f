// The tiled cross entropy (tiled_cross_entropy.h).
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/ops/tiled_cross_entropy.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "dscpp/error.h"

namespace dscpp::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType loss_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The rows of tile t of `tiles` over n rows: [begin, end).
std::pair<int64_t, int64_t> tile_rows(int64_t t, int64_t tiles, int64_t n) {
  const int64_t per = (n + tiles - 1) / tiles;
  return {std::min(n, t * per), std::min(n, (t + 1) * per)};
}

struct TiledCrossEntropy : torch::autograd::Function<TiledCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t tiles, int64_t ignore_index) {
    const at::ScalarType type = loss_type(x);
    at::Tensor sum = at::zeros({}, x.options().dtype(type));
    const at::Tensor counted = targets.ne(ignore_index);
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [begin, end] = tile_rows(t, tiles, x.size(0));
      if (begin == end) break;
      const at::Tensor logits = at::mm(x.narrow(0, begin, end - begin), weight.t()).to(type);
      const at::Tensor target = targets.narrow(0, begin, end - begin);
      const at::Tensor keep = counted.narrow(0, begin, end - begin);
      const at::Tensor picked = logits.gather(1, target.clamp(0, weight.size(0) - 1).unsqueeze(1));
      const at::Tensor row_loss = at::logsumexp(logits, 1) - picked.squeeze(1);
      sum += at::where(keep, row_loss, at::zeros_like(row_loss)).sum();
    }
    const at::Tensor count = counted.sum().to(type);
    ctx->save_for_backward({x, weight, targets, count});
    ctx->saved_data["tiles"] = tiles;
    ctx->saved_data["ignore_index"] = ignore_index;
    return sum / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &targets = saved[2], &count = saved[3];
    const int64_t tiles = ctx->saved_data["tiles"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const at::ScalarType type = loss_type(x);
    // d loss / d logits[i] = (softmax(logits[i]) - onehot(target[i])) · grad / count, counted
    // rows only; x's gradient tile by tile, W's summed over the tiles in fp32.
    const at::Tensor scale = grads[0].to(type) / count;
    at::Tensor dx = at::empty_like(x);
    at::Tensor dw = at::zeros(weight.sizes(), weight.options().dtype(type));
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [begin, end] = tile_rows(t, tiles, x.size(0));
      if (begin == end) break;
      const at::Tensor xt = x.narrow(0, begin, end - begin);
      const at::Tensor target = targets.narrow(0, begin, end - begin);
      at::Tensor d = at::softmax(at::mm(xt, weight.t()).to(type), 1);
      d.scatter_add_(1, target.clamp(0, weight.size(0) - 1).unsqueeze(1),
                     -at::ones({d.size(0), 1}, d.options()));
      d.mul_(at::where(target.ne(ignore_index), scale, at::zeros_like(scale)).unsqueeze(1));
      const at::Tensor dl = d.to(x.scalar_type());
      dx.narrow(0, begin, end - begin).copy_(at::mm(dl, weight));
      dw.add_(at::mm(dl.t(), xt));
    }
    return {dx, dw.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor tiled_cross_entropy(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& targets, int64_t tiles, int64_t ignore_index) {
  if (x.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || x.size(1) != weight.size(1) ||
      targets.size(0) != x.size(0))
    throw Error(
        fmt::format("tiled_cross_entropy: expected x [N, h], weight [V, h] and targets "
                    "[N], got [{}], [{}] and [{}]",
                    fmt::join(x.sizes(), ", "), fmt::join(weight.sizes(), ", "),
                    fmt::join(targets.sizes(), ", ")));
  if (tiles < 1) throw Error(fmt::format("tiled_cross_entropy: tiles must be >= 1, got {}", tiles));
  return TiledCrossEntropy::apply(
      x, weight, targets, std::min<int64_t>(tiles, std::max<int64_t>(x.size(0), 1)), ignore_index);
}

}  // namespace dscpp::ops
