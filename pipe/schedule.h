// Pipeline schedules as lists of instructions, one list per step, as DeepSpeed's
// TrainSchedule / InferenceSchedule: 1F1B for training (Megatron's interleaved 1F1B when a
// rank holds several chunks of layers; ZB-H1 and ZB-V, the zero-bubble paper's, with the
// backward split in two), and the inference schedule. Pure arithmetic: the pipeline engine
// (pipe/pipeline_engine.h) executes the lists, tests check them against the bubble formulas
// without running a model.
//
// The contract every schedule keeps, on which the executor's deadlock freedom rests:
// - A step lists its point-to-point instructions (Send*/Recv*) first, then its compute
//   (LoadMicroBatch, Forward, Backward), then the step-level ones (ReduceTiedGrads,
//   ReduceGrads, OptimizerStep) on the last step only. A step's sends carry results of
//   compute in earlier steps; its receives feed compute in this step or later.
// - Steps are aligned across ranks: every Send* in step t of one stage has its matching
//   Recv* (same micro-batch and chunk, the same activation or gradient) in step t of the
//   peer stage (peer_of), and the order of transfers between two neighbours is the same
//   on both sides. The executor issues a step's transfers together (on NCCL as one group),
//   so no ordering of them can deadlock.
// - Every micro-batch goes forward through every chunk on every stage once and backward
//   once (training), in dependency order: either one Backward, or a BackwardInput and, later,
//   a BackwardWeight (a split backward, ops/deferred_grads.h).
// - A buffer slot belongs to one (micro-batch, chunk) from its first instruction on this
//   stage (its RecvActivation or LoadMicroBatch) to its last (its SendGrad, its
//   BackwardWeight, or its Backward on the first stage): it holds the input, the output and
//   the input's gradient (a put-off weight gradient may read the input), and no other unit
//   uses the slot in any step of that span, not even the step that frees it. Slots are
//   numbered per stage, shared by all its chunks.
#pragma once

#include <string>
#include <vector>

namespace dscpp::pipe {

enum class Op {
  kLoadMicroBatch,  // first stage: the inputs; last stage: the labels
  kForward,
  kBackward,        // the whole backward: the input's gradient and the parameters'
  kBackwardInput,   // B: the input's gradient; the parameters' put off (ops/deferred_grads.h)
  kBackwardWeight,  // W: the parameters' gradients B put off
  kSendActivation,  // to peer_of(...): the next stage (chunk+1 on stage 0 after the last)
  kRecvActivation,
  kSendGrad,  // the gradient of the received activation, to the previous stage
  kRecvGrad,
  kReduceTiedGrads,  // sum tied layers' gradients among the stages that hold them
  kReduceGrads,      // the data-parallel reduction ZeRO's stage needs at the boundary
  kOptimizerStep,
};

struct Instruction {
  Op op;
  int micro_batch = -1;  // 0..micro_batches-1; -1 for the step-level ops
  int chunk = 0;         // which of this rank's model chunks (virtual stages), 0..chunks-1
  int buffer = -1;       // activation buffer slot, 0..num_buffers-1; -1 where none
};
using Step = std::vector<Instruction>;

// The training schedules (the config's pipeline.schedule, a dscpp extension: DeepSpeed has
// 1F1B only). kAuto: 1F1B with one chunk per rank, interleaved with several.
enum class ScheduleKind { kAuto, kOneFOneB, kInterleaved, kZeroBubbleH1, kZeroBubbleV };
// "auto", "1f1b", "interleaved", "zb-h1", "zb-v"; anything else refused with dscpp::Error
// naming what is accepted.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string to_string(ScheduleKind kind);

struct PipeShape {
  int stages = 1;         // p: ranks along the pipe axis
  int stage = 0;          // this rank's position, 0..p-1
  int micro_batches = 1;  // m: gradient_accumulation_steps
  int chunks = 1;         // v: model chunks per rank (1: plain 1F1B; >1: interleaved)
  ScheduleKind kind = ScheduleKind::kAuto;
};

// Training: 1F1B (chunks == 1) or interleaved 1F1B (chunks > 1; needs micro_batches >= stages
// and micro_batches % stages == 0, Megatron's rule: refused with dscpp::Error showing the
// arithmetic). Bubble fraction (p-1)/m, resp. (p-1)/(v*m), of the ideal step.
// ZB-H1 (chunks == 1): each backward split into B and W, 1F1B's order of forwards and
// B's with at most p - s micro-batches between their forward and B on stage s, as 1F1B holds,
// and at most p between forward and W: the W's fill what 1F1B leaves idle. With F, B and W of
// equal cost the bubble is (p-1)/(3m) of the ideal step (m >= p).
// ZB-V (chunks == 2, placed in a V: stage s holds virtual stages s and 2p - 1 - s, so the first
// stage also holds the last and computes the loss, and stage p - 1 hands its chunk 0's output
// to its chunk 1 itself): PyTorch's ZBV order of F, B and W per stage (torchtitan's
// ZBVZeroBubble), laid out on common steps as early as the dependencies allow. Each stage holds
// at most 2p chunks' activations (p micro-batches', 1F1B's most); with F, B and W of equal cost
// per chunk the bubble is (p-1)/(6m) of the ideal step for m >= 2p - 1.
std::vector<Step> train_schedule(const PipeShape& shape);

// Where virtual stage vs (0..p*v-1, in the model's order) lives: Megatron's interleaved layout
// (chunk vs / p of stage vs % p), or ZB-V's V. And the virtual stage of (stage, chunk).
struct Place {
  int stage;
  int chunk;
};
Place place_of(const PipeShape& shape, int virtual_stage);
int virtual_stage(const PipeShape& shape, int stage, int chunk);
// Whether the schedule places chunks in a V (ZB-V).
bool v_shaped(const PipeShape& shape);
// Forward only, for eval_batch: DeepSpeed's InferenceSchedule (chunks == 1), or with chunks > 1
// the interleaved layout's forwards in Megatron's order (the same refusals as training).
std::vector<Step> inference_schedule(const PipeShape& shape);
// The activation buffer slots a schedule's instructions index (DeepSpeed's num_pipe_buffers).
int num_buffers(const std::vector<Step>& steps);

// The peer stage of a Send*/Recv* instruction, and the chunk the transfer reaches there (ZB-V:
// the stage itself between its two chunks on stage p - 1).
using Peer = Place;
Peer peer_of(const PipeShape& shape, const Instruction& instruction);

// The ideal bubble fraction the formulas give: (p-1)/(v*m); ZB-H1, with F, B and W of equal
// cost: (p-1)/(3m) where m >= p, (2p-1-m)/(3m) where fewer micro-batches leave stages idle;
// ZB-V, F, B and W of equal cost per chunk: (p-1)/(6m) where m >= 2p - 1, the laid-out
// steps' where fewer.
double bubble_fraction(const PipeShape& shape);

// "ForwardPass(micro_batch=2, chunk=0, buffer=1)": DeepSpeed's names, for errors and tests.
std::string to_string(const Instruction& instruction);

}  // namespace dscpp::pipe
