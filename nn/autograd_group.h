// Internal to nn/: a process group carried through a custom autograd function's context,
// whose saved_data holds only IValues: the group goes in as a capsule (GroupHolder) under
// "group" in forward and comes out in backward. Include after dscpp/ops/autograd_function.h.
#pragma once

#include <ATen/core/ivalue.h>

#include <memory>
#include <utility>

#include "dscpp/comm/process_group.h"

namespace dscpp::nn::detail {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<comm::ProcessGroup> g) : group(std::move(g)) {}
  std::shared_ptr<comm::ProcessGroup> group;
};
using GroupHolderPtr = c10::intrusive_ptr<GroupHolder>;

inline GroupHolderPtr hold_group(std::shared_ptr<comm::ProcessGroup> group) {
  return c10::make_intrusive<GroupHolder>(std::move(group));
}

// In forward: the holder kept for backward.
inline void save_group(torch::autograd::AutogradContext* ctx, GroupHolderPtr holder) {
  ctx->saved_data["group"] = at::IValue::make_capsule(std::move(holder));
}

// In backward: the group save_group kept.
inline const std::shared_ptr<comm::ProcessGroup>& saved_group(
    torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule())
      ->group;
}

}  // namespace dscpp::nn::detail
