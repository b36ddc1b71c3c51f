// FlopsProfiler: the record-function observer that counts and times (flops_profiler.h).
// LibTorch is built with NDEBUG, and RecordFunction::inputs() asserts, without it, on a
// debug-only flag that LibTorch's own (NDEBUG) code never sets: read it as LibTorch does.
#ifndef NDEBUG
#define NDEBUG
#endif
#include "dscpp/runtime/profiler/flops_profiler.h"

#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/module_scope.h"
#include "dscpp/runtime/profiler/op_flops.h"

namespace dscpp::profiler {

struct FlopsProfiler::Observer {
  ModuleTree* tree;
  at::Device device;
  std::vector<int> scopes;  // open module scopes, innermost last; the root at the bottom
  int inside_counted = 0;   // counted operators open now: what they call is not counted

  void open(int node) {
    ModuleCounters& c = tree->counters()[static_cast<size_t>(tree->node(node).counters)];
    if (c.open++ == 0) c.opened_at = synchronized_now(device);
  }
  void close(int node) {
    ModuleCounters& c = tree->counters()[static_cast<size_t>(tree->node(node).counters)];
    if (--c.open == 0) c.duration += synchronized_now(device) - c.opened_at;
  }

  // The module an operator belongs to: the scope's child (through containers) that owns one
  // of its parameter inputs, else the innermost scope.
  int attribute(c10::ArrayRef<const c10::IValue> inputs) const {
    const int scope = scopes.back();
    for (const auto& v : inputs) {
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      int owner = tree->owner_of_parameter(t.unsafeGetTensorImpl());
      // A view of a parameter (LibTorch's Linear multiplies by weight.t()) is the parameter's.
      if (owner < 0 && t.is_view())
        owner = tree->owner_of_parameter(t._base().unsafeGetTensorImpl());
      if (owner < 0) continue;
      if (owner == scope) return scope;
      int up = tree->node(owner).parent;
      while (up >= 0 && up != scope && tree->node(up).container) up = tree->node(up).parent;
      if (up == scope) return owner;
    }
    return scope;
  }
};

namespace {

thread_local FlopsProfiler::Observer* t_observer = nullptr;

// What the start callback hands its end callback.
struct Frame : at::ObserverContext {
  enum Kind { kScope, kCounted } kind;
  int node;
  bool timed;  // kCounted: the operator's module is timed by it (a module without a scope)
  Frame(Kind k, int n, bool t) : kind(k), node(n), timed(t) {}
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  FlopsProfiler::Observer* o = t_observer;
  if (!o) return nullptr;  // a thread the profiler did not start on
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const torch::nn::Module* module = nn::ModuleScope::module_of(fn);
    const int node = module ? o->tree->node_of(module) : -1;
    if (node < 0) return nullptr;
    o->scopes.push_back(node);
    o->open(node);
    return std::make_unique<Frame>(Frame::kScope, node, true);
  }
  if (o->inside_counted > 0) return nullptr;
  const auto cost = op_cost(fn.name(), fn.inputs());
  if (!cost) return nullptr;  // no formula: what it calls is counted instead
  const int node = o->attribute(fn.inputs());
  ModuleCounters& c = o->tree->counters()[static_cast<size_t>(o->tree->node(node).counters)];
  c.flops += cost->flops;
  c.macs += cost->macs;
  ++o->inside_counted;
  const bool timed = node != o->scopes.back();
  if (timed) o->open(node);
  return std::make_unique<Frame>(Frame::kCounted, node, timed);
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  FlopsProfiler::Observer* o = t_observer;
  if (!o || !ctx) return;
  const auto* f = static_cast<const Frame*>(ctx);
  if (f->kind == Frame::kScope) {
    if (!o->scopes.empty() && o->scopes.back() == f->node) o->scopes.pop_back();
    o->close(f->node);
    return;
  }
  --o->inside_counted;
  if (f->timed) o->close(f->node);
}

}  // namespace

double FlopsProfiler::synchronized_now(at::Device device) {
  if (device.is_cuda()) {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    impl->synchronizeDevice(device.has_index() ? device.index() : impl->getDevice().index());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

FlopsProfiler::FlopsProfiler(const torch::nn::Module& model, at::Device device)
    : tree_(model), device_(device) {}

FlopsProfiler::~FlopsProfiler() {
  if (started_) stop_profile();
}

void FlopsProfiler::start_profile() {
  if (started_) return;
  if (t_observer)
    throw dscpp::Error("FlopsProfiler: another profiler is already counting on this thread");
  tree_.reset_counters();
  observer_ = std::make_unique<Observer>(Observer{&tree_, device_, {0}, 0});
  t_observer = observer_.get();
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  observer_->open(0);  // the root: the whole forward
  started_ = true;
}

void FlopsProfiler::stop_profile() {
  if (!started_) return;
  at::removeCallback(handle_);
  observer_->close(0);
  t_observer = nullptr;
  started_ = false;
}

}  // namespace dscpp::profiler
