// PipelineEngine's transfers: a step's sends and receives between neighbouring stages, issued
// together per link (comm's batch_isend_irecv: one NCCL group), after the activation meta
// where a link carries its first activation of the batch. Between two chunks of one stage
// (ZB-V's V turns on the last stage) the receive copies from the sender's chunk itself.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/error.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {

namespace {

constexpr int kActivationTag = 0, kGradTag = 1, kMetaTag = 2;

// Issues each link's ops as one batch, then waits for all.
void issue_and_wait(std::map<int, std::vector<comm::P2POp>>& by_peer, const PipelineModule& m) {
  std::vector<comm::Work> works;
  for (auto& [peer, ops] : by_peer) {
    auto link = m.link(peer);
    if (!link)
      throw Error(fmt::format("pipeline: stage {} has no link to stage {}", m.stage_id(), peer));
    for (auto& w : link->batch_isend_irecv(ops)) works.push_back(std::move(w));
  }
  for (auto& w : works) w.wait();
}

// The peer's rank on the two-rank link.
int link_rank(const PipelineModule& m, int peer) {
  return m.stage_id() < peer ? 1 : 0;
}

}  // namespace

Activation& PipelineEngine::slot(std::map<int, Slots>& slots, int chunk, int buffer,
                                 const ActivationMeta& meta, bool grads_only) {
  Slots& s = slots[chunk];
  if (!(s.meta == meta)) {  // a new shape: new buffers (the old ones go)
    s.meta = meta;
    s.buffers.clear();
  }
  if (static_cast<int>(s.buffers.size()) <= buffer) s.buffers.resize(buffer + 1);
  if (s.buffers[buffer].empty()) s.buffers[buffer] = allocate(meta, core_->device(), grads_only);
  return s.buffers[buffer];
}

void PipelineEngine::transfers(const Step& step, bool training) {
  (void)training;
  std::vector<Instruction> list;
  for (const auto& in : step) {
    if (!is_transfer(in.op)) continue;
    const Peer peer = peer_of(shape_, in);
    if (peer.stage != module_.stage_id()) {
      list.push_back(in);
      continue;
    }
    // On this stage: the receive takes what the other chunk holds (its send does nothing).
    if (in.op == Op::kRecvActivation) {
      const auto& out = live_.at({peer.chunk, in.micro_batch}).outputs;
      if (!meta_in_.count(in.chunk)) meta_in_[in.chunk] = meta_of(out);
      Activation& buf = slot(act_slots_, in.chunk, in.buffer, meta_in_.at(in.chunk), false);
      for (size_t i = 0; i < buf.size(); ++i) buf[i].copy_(out.at(i).detach());
    } else if (in.op == Op::kRecvGrad) {
      auto& f = live_.at({in.chunk, in.micro_batch});
      f.out_grads = slot(grad_slots_, in.chunk, in.buffer, meta_of(f.outputs), true);
      const auto& in_grads = live_.at({peer.chunk, in.micro_batch}).in_grads;
      for (size_t i = 0; i < f.out_grads.size(); ++i) f.out_grads[i].copy_(in_grads.at(i));
    }
  }
  // A micro-batch whose gradient went to the other chunk is done on it.
  for (const auto& in : step)
    if (in.op == Op::kSendGrad && peer_of(shape_, in).stage == module_.stage_id())
      live_.erase({in.chunk, in.micro_batch});
  if (list.empty()) return;
  const at::Device device = core_->device();
  // 1. The meta of a chunk's activation stream, on its first transfer of the batch.
  std::map<int, std::vector<comm::P2POp>> meta_ops;
  std::map<int, at::Tensor> meta_recv;  // chunk -> encoded meta arriving
  for (const auto& in : list) {
    const int peer = peer_of(shape_, in).stage;
    const int r = link_rank(module_, peer);
    if (in.op == Op::kSendActivation && !meta_sent_[in.chunk]) {
      meta_sent_[in.chunk] = true;
      const auto& out = live_.at({in.chunk, in.micro_batch}).outputs;
      meta_ops[peer].push_back(
          {comm::P2POp::kSend, encode_meta(meta_of(out), device), r, kMetaTag});
    } else if (in.op == Op::kRecvActivation && !meta_in_.count(in.chunk) &&
               !meta_recv.count(in.chunk)) {
      at::Tensor t = at::zeros({kMetaLength}, at::TensorOptions().dtype(at::kLong).device(device));
      meta_recv[in.chunk] = t;
      meta_ops[peer].push_back({comm::P2POp::kRecv, t, r, kMetaTag});
    }
  }
  if (!meta_ops.empty()) issue_and_wait(meta_ops, module_);
  for (auto& [chunk, t] : meta_recv) meta_in_[chunk] = decode_meta(t);
  // 2. The step's data, in the schedule's order on each link.
  std::map<int, std::vector<comm::P2POp>> ops;
  for (const auto& in : list) {
    const int peer = peer_of(shape_, in).stage;
    const int r = link_rank(module_, peer);
    auto& link_ops = ops[peer];
    switch (in.op) {
      case Op::kSendActivation:
        for (const auto& t : live_.at({in.chunk, in.micro_batch}).outputs)
          link_ops.push_back({comm::P2POp::kSend, t.detach().contiguous(), r, kActivationTag});
        break;
      case Op::kRecvActivation:
        for (auto& t : slot(act_slots_, in.chunk, in.buffer, meta_in_.at(in.chunk), false))
          link_ops.push_back({comm::P2POp::kRecv, t, r, kActivationTag});
        break;
      case Op::kSendGrad: {
        auto& f = live_.at({in.chunk, in.micro_batch});
        for (const auto& g : f.in_grads)
          link_ops.push_back({comm::P2POp::kSend, g.contiguous(), r, kGradTag});
        break;
      }
      case Op::kRecvGrad: {
        auto& f = live_.at({in.chunk, in.micro_batch});
        f.out_grads = slot(grad_slots_, in.chunk, in.buffer, meta_of(f.outputs), true);
        for (auto& g : f.out_grads) link_ops.push_back({comm::P2POp::kRecv, g, r, kGradTag});
        break;
      }
      default:
        break;
    }
  }
  issue_and_wait(ops, module_);
  // A micro-batch whose gradient went back is done on this stage.
  for (const auto& in : list)
    if (in.op == Op::kSendGrad) live_.erase({in.chunk, in.micro_batch});
}

}  // namespace dscpp::pipe
