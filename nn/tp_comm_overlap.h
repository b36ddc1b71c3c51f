// tp_comm_overlap (Megatron's option; the "collective matmul" of Wang et al. and of
// Megatron/Transformer Engine's userbuffers, the pipelined form of DeepSpeed's Domino): the
// FORWARD collectives of the parallel linears cut into num_splits pieces along dim 0, the
// collective of one piece in flight while the product of another runs.
//
// Why dim 0 of this rank's rows and a chunked collective, not the batch dim or a ring of
// point-to-point steps: the micro-batch is often 1 in tensor-parallel training while the
// sequence always has rows to spare; a dim-0 piece of a contiguous tensor is contiguous, so
// every collective reads and writes its slice of one buffer in place; and a chunked
// all-gather/reduce-scatter is one collective per piece on both backends (Work: NCCL's own
// stream, Gloo's worker thread) with num_splits free, where a ring needs t - 1 send/recv pairs
// per layer and fixes the pieces to t.
//
//   ColumnParallelLinear, sequence parallel (linear_async_communication.h): piece j of this
//     rank's [s/t, ..., in] rows is all-gathered ([t, len_j, ..., in], rows r·s/t + off_j ...)
//     while the product of piece j-1 runs; each product lands in its rows of one [s, ..., out/t].
//   RowParallelLinear (row_parallel_linear_overlapped below): the product of piece j+1 runs
//     while the reduce-scatter (sequence parallel: rows off_j.. of every rank's shard, written
//     in place into the output shard) or the all-reduce (rows off_j.. of the output) of piece
//     j is in flight.
// Values: each output row is the product of the same row and the same weight, and each sum
// runs over the same ranks; only the BLAS blocking of a smaller product may differ (fp32:
// within 1e-6 relative; bit-equal on the CPU builds tested).
// Rows that do not divide by num_splits: the pieces differ by one row (at::tensor_split's
// rule, the same on every rank); more pieces than rows: one row a piece.
// Not done: Domino's own scheme without sequence parallelism (the block runs two half
// micro-batches interleaved, the all-reduce of one half overlapping the next layer's products
// of the other). It does not fit the layer API: a layer's forward returns finished tensors, and
// Domino carries an unwaited Work across autograd ops of the next layers; it needs the block
// to own the split. The row-level all-reduce above is the part that fits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

// The pieces of `rows` rows: (offset, length) each, min(num_splits, rows) of them, in order.
// num_splits < 1: TensorParallelError.
std::vector<std::pair<int64_t, int64_t>> tp_comm_overlap_pieces(int64_t rows, int64_t num_splits);

// RowParallelLinear's product and reduction, pipelined: x [s, ..., in/t], weight [out, in/t] ->
// Σ_r x_r weight_rᵀ all-reduced [s, ..., out], or (sequence_parallel) reduce-scattered along dim
// 0 to this rank's [s/t, ..., out]. No bias (the layer adds it after the sum). Backward: the
// output's gradient all-gathered (sequence_parallel) or taken as it is, then the products of
// nn::linear. A group of size one (or null): nn::linear.
at::Tensor row_parallel_linear_overlapped(const at::Tensor& x, const at::Tensor& weight,
                                          const GroupPtr& group, bool sequence_parallel,
                                          int64_t num_splits);

}  // namespace dscpp::nn
