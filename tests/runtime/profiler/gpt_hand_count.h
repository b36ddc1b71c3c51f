// The GPT's forward work counted by hand from its shape, independently of the profiler: what
// each of model_zoo's GPT modules computes, with DeepSpeed's formulas (a matrix product of
// m*k by k*n is m*k*n MACs; attention's two products over the whole score matrix; layer_norm
// 5 flops per element; an add or GELU 1).
#pragma once

#include <cstdint>

#include "dscpp/model_zoo/gpt_config.h"

struct GPTHandCount {
  int64_t matmul_macs = 0;        // the linears and the tied head
  int64_t attention_macs = 0;     // q k^T and the weighted sum of v
  int64_t elementwise_flops = 0;  // layer norms, residual and embedding adds, bias + GELU
  int64_t flops() const { return 2 * (matmul_macs + attention_macs) + elementwise_flops; }
};

inline GPTHandCount gpt_hand_count(const dscpp::model_zoo::GPTConfig& c, int64_t batch,
                                   int64_t seq) {
  const int64_t h = c.hidden_size, f = c.ffn_size(), v = c.vocab_size, layers = c.num_layers;
  const int64_t tokens = batch * seq;
  GPTHandCount n;
  // Per block: qkv [h -> 3h], proj [h -> h], fc [h -> f], proj [f -> h]; then the head [h -> V].
  n.matmul_macs = layers * tokens * (h * 3 * h + h * h + h * f + f * h) + tokens * h * v;
  // Per block and head: scores [S x d] by [d x S], then [S x S] by [S x d]; over the heads
  // the d's add up to h.
  n.attention_macs = layers * 2 * batch * seq * seq * h;
  // The embedding's word + position add; per block two layer norms (5 per element), two
  // residual adds, fc's bias add and the GELU over [tokens, f]; the final layer norm.
  // Dropout is none (its probability is 0 in these configs, and DeepSpeed counts none).
  n.elementwise_flops =
      tokens * h + layers * (2 * 5 * tokens * h + 2 * tokens * h + 2 * tokens * f) + 5 * tokens * h;
  return n;
}
