// NvmeSwapper: see nvme_swap.h.
#include "dscpp/zero/nvme_swap.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "dscpp/error.h"

namespace dscpp::zero {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kElement = sizeof(float);

}  // namespace

void check_nvme_path(const std::string& path, const std::string& key) {
  const std::string where = fmt::format("{} '{}'", key, path);
  if (path.empty()) throw Error(key + ": NVMe offload needs a path, none given");
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(where + ": does not exist");
  if (!fs::is_directory(st)) throw Error(where + ": is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0) throw Error(where + ": is not writable");
}

std::string make_swap_folder(const std::string& path, const std::string& key,
                             const std::vector<std::string>& parts) {
  check_nvme_path(path, key);
  // Another rank's remove_swap_folder may take an empty parent away at any point: between our
  // making it and making its child (ENOENT), between our mkdir finding it there and
  // create_directory's look at what it found (EEXIST), or after both (no error, and no folder
  // when we look): start again from the top. Once our folder is in it, a parent is no longer
  // empty and stays, so a few tries always suffice.
  constexpr int kTries = 64;
  for (int attempt = 1;; ++attempt) {
    fs::path folder(path);
    std::error_code ec;
    bool made = true;
    for (const std::string& part : parts) {
      folder /= part;
      if (fs::is_directory(folder, ec)) continue;
      if (fs::create_directory(folder, ec) || fs::is_directory(folder)) continue;
      made = false;
      break;
    }
    if (made) return folder.string();
    const bool raced =
        !ec || ec == std::errc::no_such_file_or_directory || ec == std::errc::file_exists;
    if (!raced || attempt == kTries)
      throw Error(fmt::format("{} '{}': cannot make the swap folder '{}': {}", key, path,
                              folder.string(),
                              ec ? ec.message() : "removed again each time it was made"));
  }
}

void remove_swap_folder(const std::string& folder, int levels) {
  fs::path f(folder);
  for (int up = 0; up <= levels; ++up, f = f.parent_path()) {
    std::error_code ec;
    if (!fs::remove(f, ec)) break;
  }
}

NvmeSwapper::NvmeSwapper(const NvmeOptions& options, int64_t numel)
    : options_(options), numel_(numel) {
  if (options_.buffer_count < 1)
    throw Error(
        fmt::format("zero_optimization.offload_optimizer.buffer_count: NVMe offload "
                    "needs at least 1 buffer, found {}",
                    options_.buffer_count));
  // DeepSpeed's layout: nvme_path/zero_stage_<s>/optimizer/rank<r>.
  folder_ = make_swap_folder(options_.path, options_.key,
                             {fmt::format("zero_stage_{}", options_.stage), "optimizer",
                              fmt::format("rank{}", options_.rank)});
}

NvmeSwapper::~NvmeSwapper() {
  try {
    finish();
  } catch (...) {  // an I/O error has been reported by the step that met it
  }
  slots_.clear();
  files_.clear();  // each file removes itself
  // The rank's folder, then optimizer/ and zero_stage_<s>/ where they are empty.
  remove_swap_folder(folder_, 2);
}

void NvmeSwapper::add(const std::string& name, float value) {
  if (files_.count(name)) throw Error("NvmeSwapper: '" + name + "' added twice");
  const std::string path = (fs::path(folder_) / (name + ".tensor.swp")).string();
  files_[name] = std::make_unique<NvmeFile>(path, options_.aio, /*create=*/true, numel_ * kElement);
  fill(name, 0, numel_, value);
}

void NvmeSwapper::fill(const std::string& name, int64_t begin, int64_t end, float value) {
  NvmeFile& f = *files_.at(name);
  const int64_t block = std::min<int64_t>(end - begin, 1 << 20);
  if (block <= 0) return;
  const at::Tensor values = at::full({block}, value, at::TensorOptions().dtype(at::kFloat));
  for (int64_t at_ = begin; at_ < end; at_ += block) {
    const int64_t n = std::min(block, end - at_);
    f.wait(f.write(at_ * kElement, values.data_ptr(), n * kElement));
  }
}

at::Tensor NvmeSwapper::read_all(const std::string& name) {
  finish();
  NvmeFile& f = *files_.at(name);
  at::Tensor t = at::empty({numel_}, at::TensorOptions().dtype(at::kFloat));
  f.wait(f.read(0, t.data_ptr(), numel_ * kElement));
  return t;
}

void NvmeSwapper::write_all(const std::string& name, const at::Tensor& values) {
  finish();
  if (values.numel() != numel_)
    throw Error(
        fmt::format("NvmeSwapper: '{}' takes {} elements, given {}", name, numel_, values.numel()));
  const at::Tensor src = values.to(at::kCPU, at::kFloat).contiguous();
  NvmeFile& f = *files_.at(name);
  f.wait(f.write(0, src.data_ptr(), numel_ * kElement));
}

void NvmeSwapper::plan(std::vector<std::pair<int64_t, int64_t>> ranges) {
  finish();
  int64_t largest = 0;
  for (const auto& [b, e] : ranges) {
    if (b < 0 || e > numel_ || b > e)
      throw Error(fmt::format("NvmeSwapper: range [{}, {}) of {} elements", b, e, numel_));
    largest = std::max(largest, e - b);
  }
  // Buffers sized by the largest range.
  if (largest > slot_numel_ || slots_.size() != static_cast<size_t>(options_.buffer_count) ||
      (!slots_.empty() && slots_[0].buffers.size() != files_.size())) {
    slots_.clear();
    slots_.resize(static_cast<size_t>(options_.buffer_count));
    const auto host =
        at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(options_.pin_memory);
    for (Slot& s : slots_)
      for (const auto& [name, f] : files_) s.buffers[name] = at::empty({largest}, host);
    slot_numel_ = largest;
  }
  ranges_ = std::move(ranges);
  cursor_ = issued_ = 0;
}

void NvmeSwapper::wait(std::vector<std::pair<NvmeFile*, int64_t>>& tickets) {
  // Every ticket is waited on, and the first error thrown after: a buffer is never reused
  // while the kernel may still write into it.
  std::string first;
  for (auto& [f, t] : tickets) {
    try {
      f->wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  }
  tickets.clear();
  if (!first.empty()) throw Error(first);
}

void NvmeSwapper::issue_read(size_t j) {
  Slot& s = slots_[j % slots_.size()];
  wait(s.writes);  // the slot's last range is on the disk before it is overwritten
  const auto [b, e] = ranges_[j];
  if (e == b) return;
  for (auto& [name, f] : files_)
    s.reads.emplace_back(f.get(),
                         f->read(b * kElement, s.buffers.at(name).data_ptr(), (e - b) * kElement));
}

std::map<std::string, at::Tensor> NvmeSwapper::acquire(int64_t begin, int64_t end) {
  if (cursor_ >= ranges_.size() || ranges_[cursor_] != std::make_pair(begin, end))
    throw Error(
        fmt::format("NvmeSwapper: range [{}, {}) acquired out of the planned order", begin, end));
  // Read ahead: with B buffers, up to B - 2 ranges beyond this one (B - 1 with fewer than 3),
  // so that the write of the range before this one may still run.
  const size_t count = slots_.size();
  const size_t ahead = count >= 3 ? count - 2 : count - 1;
  const size_t last = std::min(ranges_.size(), cursor_ + ahead + 1);
  if (issued_ <= cursor_) issued_ = cursor_;
  for (; issued_ < last; ++issued_) issue_read(issued_);
  Slot& s = slots_[cursor_ % count];
  wait(s.reads);
  std::map<std::string, at::Tensor> views;
  for (auto& [name, t] : s.buffers) views[name] = t.narrow(0, 0, end - begin);
  return views;
}

void NvmeSwapper::release() {
  Slot& s = slots_[cursor_ % slots_.size()];
  const auto [b, e] = ranges_[cursor_];
  if (e > b)
    for (auto& [name, f] : files_)
      s.writes.emplace_back(
          f.get(), f->write(b * kElement, s.buffers.at(name).data_ptr(), (e - b) * kElement));
  ++cursor_;
  for (auto& [name, f] : files_) f->progress();
}

void NvmeSwapper::finish() {
  for (Slot& s : slots_) {
    wait(s.reads);
    wait(s.writes);
  }
  ranges_.clear();
  cursor_ = issued_ = 0;
}

int64_t NvmeSwapper::bytes_on_disk() const {
  return static_cast<int64_t>(files_.size()) * numel_ * kElement;
}

int64_t NvmeSwapper::buffer_numel() const {
  int64_t n = 0;
  for (const Slot& s : slots_)
    for (const auto& [name, t] : s.buffers) n += t.numel();
  return n;
}

}  // namespace dscpp::zero
