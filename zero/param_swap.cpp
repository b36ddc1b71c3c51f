// ParamSwapper: see param_swap.h.
#include "dscpp/zero/param_swap.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "dscpp/error.h"
#include "dscpp/zero/nvme_swap.h"

namespace dscpp::zero {

namespace {

constexpr const char* kKey = "zero_optimization.offload_param";

// PyTorch's name of the dtype, as DeepSpeed's folder has it (torch.bfloat16 -> bfloat16params).
std::string torch_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      throw Error(fmt::format("{}: NVMe offload of {} parameters", kKey, c10::toString(t)));
  }
}

}  // namespace

ParamSwapper::ParamSwapper(const ParamNvmeOptions& options, at::ScalarType dtype,
                           std::vector<int64_t> chunks, std::vector<bool> swapped)
    : options_(options), dtype_(dtype), chunks_(std::move(chunks)) {
  if (swapped.size() != chunks_.size()) throw Error("ParamSwapper: a flag for every bucket");
  if (options_.buffer_count < 1)
    throw Error(fmt::format(
        "{}.buffer_count: NVMe offload of the parameters needs at least 1 buffer, found {}", kKey,
        options_.buffer_count));
  const std::string name = torch_name(dtype_);
  element_ = static_cast<int64_t>(c10::elementSize(dtype_));
  for (size_t b = 0; b < chunks_.size(); ++b) {
    if (!swapped[b] || chunks_[b] <= slot_numel_) continue;
    if (chunks_[b] > options_.buffer_size)
      throw Error(fmt::format(
          "{}.buffer_size: {} elements per swap buffer, but this rank's chunk of bucket {} holds "
          "{} (a bucket is about reduce_bucket_size elements, or one parameter if larger, split "
          "over the ranks): raise buffer_size to at least {}, or lower reduce_bucket_size",
          kKey, options_.buffer_size, b, chunks_[b], chunks_[b]));
    slot_numel_ = chunks_[b];
  }
  folder_ =
      make_swap_folder(options_.path, std::string(kKey) + ".nvme_path",
                       {"zero_stage_3", name + "params", fmt::format("rank{}", options_.rank)});
  files_.resize(chunks_.size());
  slot_of_.assign(chunks_.size(), -1);
  try {
    for (size_t b = 0; b < chunks_.size(); ++b)
      if (swapped[b])
        files_[b] = std::make_unique<NvmeFile>(file_of(static_cast<int>(b)), options_.aio,
                                               /*create=*/true, chunks_[b] * element_);
  } catch (...) {
    files_.clear();
    remove_swap_folder(folder_, 2);
    throw;
  }
}

ParamSwapper::~ParamSwapper() {
  for (Slot& s : slots_) {
    try {
      settle(s);
    } catch (...) {  // an I/O error has been reported by whoever waited on it first
    }
  }
  slots_.clear();
  files_.clear();  // each file removes itself
  remove_swap_folder(folder_, 2);
}

std::string ParamSwapper::file_of(int b) const {
  return (std::filesystem::path(folder_) / fmt::format("{}_param.tensor.swp", b)).string();
}

at::Tensor ParamSwapper::chunk_of(Slot& s, int b) const {
  return s.memory.narrow(0, 0, chunks_.at(b));
}

bool ParamSwapper::buffer_available() const {
  if (static_cast<int64_t>(slots_.size()) < options_.buffer_count) return true;
  for (const Slot& s : slots_)
    if (s.use == Use::kFree || s.use == Use::kAhead || s.use == Use::kWriting) return true;
  return false;
}

int ParamSwapper::buffers_in_use() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.use != Use::kFree;
  return n;
}

int64_t ParamSwapper::buffer_numel() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.memory.numel();
  return n;
}

void ParamSwapper::count_use() {
  peak_in_use_ = std::max(peak_in_use_, buffers_in_use());
}

void ParamSwapper::settle(Slot& s) {
  if (s.ticket < 0) return;
  const int64_t t = s.ticket;
  s.ticket = -1;
  files_.at(s.bucket)->wait(t);
}

void ParamSwapper::free(Slot& s) {
  if (s.bucket >= 0 && slot_of_[s.bucket] >= 0 && &slots_[slot_of_[s.bucket]] == &s)
    slot_of_[s.bucket] = -1;
  s.use = Use::kFree;
  s.bucket = -1;
  s.holds = 0;
  s.read_ahead = false;
}

int ParamSwapper::take() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].use == Use::kFree) return static_cast<int>(i);
  if (static_cast<int64_t>(slots_.size()) < options_.buffer_count) {
    Slot s;
    s.memory = at::empty({slot_numel_},
                         at::TensorOptions().dtype(dtype_).pinned_memory(options_.pin_memory));
    slots_.push_back(std::move(s));
    return static_cast<int>(slots_.size()) - 1;
  }
  // The oldest write, else the last read ahead (the one needed last).
  int oldest = -1, last = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.use == Use::kWriting && (oldest < 0 || s.order < slots_[oldest].order))
      oldest = static_cast<int>(i);
    if (s.use == Use::kAhead && (last < 0 || s.order > slots_[last].order))
      last = static_cast<int>(i);
  }
  const int i = oldest >= 0 ? oldest : last;
  if (i < 0)
    throw Error(
        fmt::format("ParamSwapper: all {} buffers are held by gathers", options_.buffer_count));
  Slot& s = slots_[i];
  settle(s);
  free(s);
  return i;
}

bool ParamSwapper::read_ahead(int b) {
  if (!swapped(b)) return true;
  if (const int i = slot_of_[b]; i >= 0) {
    // A write in flight: its buffer holds the chunk already.
    if (slots_[i].use == Use::kWriting) slots_[i].use = Use::kAhead;
    return true;
  }
  int i = -1;
  for (size_t k = 0; k < slots_.size() && i < 0; ++k)
    if (slots_[k].use == Use::kFree) i = static_cast<int>(k);
  if (i < 0) {
    if (static_cast<int64_t>(slots_.size()) >= options_.buffer_count) return false;
    i = take();
  }
  Slot& s = slots_[i];
  s.use = Use::kAhead;
  s.bucket = b;
  s.read_ahead = true;
  s.order = issued_++;
  s.ticket = files_[b]->read(0, s.memory.data_ptr(), chunks_[b] * element_);
  slot_of_[b] = i;
  ++reads_;
  count_use();
  return true;
}

at::Tensor ParamSwapper::acquire(int b) {
  if (!swapped(b)) throw Error(fmt::format("ParamSwapper: bucket {} is not swapped", b));
  int i = slot_of_[b];
  if (i < 0) {
    i = take();
    Slot& s = slots_[i];
    s.bucket = b;
    s.ticket = files_[b]->read(0, s.memory.data_ptr(), chunks_[b] * element_);
    slot_of_[b] = i;
    ++reads_;
  }
  Slot& s = slots_[i];
  if (s.use == Use::kStaged)
    throw Error(fmt::format("ParamSwapper: bucket {} read while staged for a write", b));
  if (s.use == Use::kAhead && s.read_ahead) ++reads_ahead_used_;
  s.read_ahead = false;
  s.use = Use::kHeld;
  ++s.holds;
  count_use();
  settle(s);  // the read (or the write whose buffer this is) is done
  return chunk_of(s, b);
}

void ParamSwapper::let_go(int b) {
  const int i = slot_of_.at(b);
  if (i < 0 || slots_[i].use != Use::kHeld) return;
  if (--slots_[i].holds <= 0) free(slots_[i]);
}

at::Tensor ParamSwapper::stage_write(int b) {
  if (!swapped(b)) throw Error(fmt::format("ParamSwapper: bucket {} is not swapped", b));
  int i = slot_of_[b];
  if (i >= 0) {
    Slot& s = slots_[i];
    if (s.use == Use::kStaged) return chunk_of(s, b);
    if (s.use == Use::kHeld)
      throw Error(fmt::format("ParamSwapper: bucket {} written while a gather holds it", b));
    settle(s);  // a read ahead (given up) or a write, still in flight
  } else {
    i = take();
  }
  Slot& s = slots_[i];
  s.use = Use::kStaged;
  s.bucket = b;
  s.read_ahead = false;
  slot_of_[b] = i;
  count_use();
  return chunk_of(s, b);
}

void ParamSwapper::write(int b) {
  const int i = slot_of_.at(b);
  if (i < 0 || slots_[i].use != Use::kStaged)
    throw Error(fmt::format("ParamSwapper: bucket {} written without a staged buffer", b));
  Slot& s = slots_[i];
  s.ticket = files_[b]->write(0, s.memory.data_ptr(), chunks_[b] * element_);
  s.use = Use::kWriting;
  s.order = issued_++;
  ++writes_;
  files_[b]->progress();
}

void ParamSwapper::drop_reads_ahead() {
  for (Slot& s : slots_) {
    if (s.use != Use::kAhead) continue;
    settle(s);
    free(s);
  }
}

void ParamSwapper::wait_writes() {
  for (Slot& s : slots_) {
    if (s.use != Use::kWriting) continue;
    settle(s);
    free(s);
  }
}

void ParamSwapper::progress() {
  for (Slot& s : slots_)
    if (s.ticket >= 0) files_[s.bucket]->progress();
}

int64_t ParamSwapper::bytes_on_disk() const {
  int64_t n = 0;
  for (size_t b = 0; b < files_.size(); ++b)
    if (files_[b]) n += chunks_[b] * element_;
  return n;
}

}  // namespace dscpp::zero
