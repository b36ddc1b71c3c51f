// The safetensors format: see safetensors.h.
#include "dscpp/runtime/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "dscpp/runtime/checkpoint/atomic_file.h"
#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {

namespace {

using nlohmann::json;

const std::vector<std::pair<const char*, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<const char*, at::ScalarType>> d = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  return d;
}

// The byte limit of a header we read: safetensors' own is 100 MB.
constexpr uint64_t kMaxHeader = 100ull << 20;

}  // namespace

void save_safetensors(const NamedTensors& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;
    const at::Tensor& t = entry.second;
    if (name == "__metadata__" || header.contains(name))
      throw CheckpointError("'" + path + "': tensor name '" + name + "' is reserved or repeated");
    auto it = std::find_if(dtypes().begin(), dtypes().end(),
                           [&](const auto& d) { return d.second == t.scalar_type(); });
    if (it == dtypes().end())
      throw CheckpointError(
          fmt::format("'{}': tensor '{}' has dtype {}, which safetensors does "
                      "not hold here",
                      path, name, c10::toString(t.scalar_type())));
    at::Tensor c = t.detach().cpu().contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", it->first},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFile out(path);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const at::Tensor& c : data)
    out.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  out.commit();
}

namespace {

// Reads [offset, offset + n) of the source into dst; false when it cannot.
using ReadAt = std::function<bool(uint64_t offset, uint64_t n, void* dst)>;

// The format over any source of `size` bytes; `name` names it in errors.
Safetensors parse(const ReadAt& read_at, uint64_t size, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return CheckpointError("'" + name + "' is not a safetensors file: " + what);
  };
  if (size < 8) throw bad(fmt::format("{} bytes, fewer than the 8 of the header length", size));
  unsigned char len[8];
  if (!read_at(0, 8, len)) throw CheckpointError("cannot read '" + name + "'");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kMaxHeader || n > size - 8)
    throw bad(
        fmt::format("header length {} (byte 0) exceeds the file's {} bytes or 100 MB", n, size));
  std::string text(n, '\0');
  if (!read_at(8, n, text.data())) throw CheckpointError("cannot read '" + name + "'");
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    throw bad(std::string("header JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header is not a JSON object");
  const uint64_t data_size = size - 8 - n;
  Safetensors out;
  struct Entry {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [key, v] : header.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, m] : v.items()) {
        if (!m.is_string()) throw bad("__metadata__ value of '" + k + "' is not a string");
        out.metadata[k] = m.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw bad(where + "expected {dtype, shape, data_offsets: [begin, end]}");
    const std::string dt = v["dtype"].get<std::string>();
    auto it = std::find_if(dtypes().begin(), dtypes().end(),
                           [&](const auto& d) { return dt == d.first; });
    if (it == dtypes().end()) throw bad(where + "unknown dtype '" + dt + "'");
    Entry e{key, it->second, {}, 0, 0};
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad(where + "shape holds a non-natural number");
      const uint64_t dim = d.get<uint64_t>();
      // No dimension, and no product of them, is larger than the data that holds it (an
      // empty tensor aside: a zero keeps the product at zero).
      if (dim > data_size && dim != 0) throw bad(where + "a dimension larger than the data");
      if (__builtin_mul_overflow(numel, dim, &numel) || numel > data_size)
        throw bad(where + "a shape larger than the data");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) throw bad(where + "data_offsets are not natural numbers");
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    if (e.begin > e.end || e.end > data_size)
      throw bad(where + fmt::format("data_offsets [{}, {}] outside the {} bytes of data", e.begin,
                                    e.end, data_size));
    if (e.end - e.begin != bytes)
      throw bad(where + fmt::format("data_offsets span {} bytes, its shape and dtype {}",
                                    e.end - e.begin, bytes));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      throw bad("tensors '" + entries[i - 1].name + "' and '" + entries[i].name + "' overlap");
  for (const Entry& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    if (!read_at(8 + n + e.begin, e.end - e.begin, t.data_ptr()))
      throw CheckpointError("cannot read tensor '" + e.name + "' of '" + name + "'");
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace

Safetensors load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw CheckpointError("cannot open '" + path + "'");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  return parse(
      [&](uint64_t offset, uint64_t n, void* dst) {
        in.seekg(static_cast<std::streamoff>(offset));
        in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
        return static_cast<bool>(in);
      },
      size, path);
}

Safetensors safetensors_from_memory(std::string_view bytes, const std::string& name) {
  return parse(
      [&](uint64_t offset, uint64_t n, void* dst) {
        if (offset > bytes.size() || n > bytes.size() - offset) return false;
        if (n) std::memcpy(dst, bytes.data() + offset, n);
        return true;
      },
      bytes.size(), name);
}

}  // namespace dscpp::checkpoint
