// save_torch_file: torch.save's zip layout, written record by record, pickle protocol 2.
#include "dscpp/runtime/checkpoint/torch_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "dscpp/error.h"
#include "dscpp/runtime/checkpoint/atomic_file.h"
#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/torch_format.h"

namespace dscpp::checkpoint {

using detail::error_text;
using detail::storage_dtype;
using detail::storage_name;

namespace {

// ---------------------------------------------------------------------------------------------
// Pickler: protocol 2, the opcodes Python's pickle writes for torch.save
// ---------------------------------------------------------------------------------------------

constexpr size_t kBatch = 1000;  // pickle's _BATCHSIZE
constexpr int kMaxDepth = 10000;

class Pickler {
 public:
  std::string out;
  std::vector<at::Tensor> storages;  // data/<index>

  void dump(const PyValue& root) {
    op(0x80);
    op(2);
    value(root, 0);
    op('.');
  }

 private:
  std::unordered_map<const void*, size_t> keys_;

  void op(uint8_t c) { out.push_back(static_cast<char>(c)); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void global(const char* module, const char* name) {
    op('c');
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void str(const std::string& s) {
    if (s.size() > 0xffffffffULL) throw dscpp::Error("string too long to pickle");
    op('X');
    le(s.size(), 4);
    out += s;
  }
  void integer(int64_t i) {
    if (i >= 0 && i < 256) {
      op('K');
      le(static_cast<uint64_t>(i), 1);
    } else if (i >= 0 && i < 65536) {
      op('M');
      le(static_cast<uint64_t>(i), 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      op('J');
      le(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(i))), 4);
    } else {
      uint8_t b[8];
      for (int k = 0; k < 8; ++k)
        b[k] = static_cast<uint8_t>((static_cast<uint64_t>(i) >> (8 * k)));
      int n = 8;
      while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) ||
                       (b[n - 1] == 0xff && (b[n - 2] & 0x80)))) {
        --n;
      }
      op(0x8a);
      op(static_cast<uint8_t>(n));
      for (int k = 0; k < n; ++k) op(b[k]);
    }
  }
  void real(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    op('G');
    for (int k = 7; k >= 0; --k) out.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  }
  void int_tuple(c10::IntArrayRef v) {
    if (v.empty()) {
      op(')');
      return;
    }
    if (v.size() > 3) op('(');
    for (int64_t x : v) integer(x);
    if (v.size() == 1) op(0x85);
    if (v.size() == 2) op(0x86);
    if (v.size() == 3) op(0x87);
    if (v.size() > 3) op('t');
  }

  void tensor(const at::Tensor& t) {
    if (!t.defined()) throw dscpp::Error("cannot save an undefined tensor");
    if (t.layout() != at::kStrided || t.is_quantized()) {
      throw dscpp::Error("can only save dense (strided) tensors");
    }
    const char* sname = storage_name(t.scalar_type());
    const void* impl = t.unsafeGetTensorImpl();
    size_t key;
    auto it = keys_.find(impl);
    if (it != keys_.end()) {
      key = it->second;
    } else {
      key = storages.size();
      keys_.emplace(impl, key);
      storages.push_back(t);
    }
    std::vector<int64_t> sizes = t.sizes().vec();
    std::vector<int64_t> strides(sizes.size());
    int64_t s = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      strides[d] = s;
      s *= std::max<int64_t>(sizes[d], 1);
    }
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    str("storage");
    global("torch", sname);
    str(std::to_string(key));
    str("cpu");
    integer(t.numel());
    op('t');
    op('Q');
    integer(0);
    int_tuple(sizes);
    int_tuple(strides);
    op(t.requires_grad() ? 0x88 : 0x89);
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }

  void value(const PyValue& v, int depth) {
    if (depth > kMaxDepth) throw dscpp::Error("value nested too deeply to pickle");
    switch (v.kind()) {
      case PyValue::Kind::None:
        op('N');
        return;
      case PyValue::Kind::Bool:
        op(v.as_bool() ? 0x88 : 0x89);
        return;
      case PyValue::Kind::Int:
        integer(v.as_int());
        return;
      case PyValue::Kind::Double:
        real(v.as_double());
        return;
      case PyValue::Kind::String:
        str(v.as_string());
        return;
      case PyValue::Kind::Tensor:
        tensor(v.as_tensor());
        return;
      case PyValue::Kind::Tuple: {
        if (v.is_torch_size()) {
          // torch.Size(tuple): the class, its one argument, REDUCE.
          global("torch", "Size");
          int_tuple(v.as_ints());
          op(0x85);
          op('R');
          return;
        }
        const auto& items = v.items();
        if (items.empty()) {
          op(')');
          return;
        }
        if (items.size() > 3) op('(');
        for (const auto& x : items) value(x, depth + 1);
        if (items.size() == 1) op(0x85);
        if (items.size() == 2) op(0x86);
        if (items.size() == 3) op(0x87);
        if (items.size() > 3) op('t');
        return;
      }
      case PyValue::Kind::List: {
        op(']');
        const auto& items = v.items();
        for (size_t b = 0; b < items.size(); b += kBatch) {
          size_t e = std::min(items.size(), b + kBatch);
          if (e - b == 1) {
            value(items[b], depth + 1);
            op('a');
          } else {
            op('(');
            for (size_t i = b; i < e; ++i) value(items[i], depth + 1);
            op('e');
          }
        }
        return;
      }
      case PyValue::Kind::Dict: {
        if (v.ordered()) {
          global("collections", "OrderedDict");
          op(')');
          op('R');
        } else {
          op('}');
        }
        const auto& keys = v.keys();
        const auto& vals = v.values();
        for (size_t b = 0; b < keys.size(); b += kBatch) {
          size_t e = std::min(keys.size(), b + kBatch);
          if (e - b == 1) {
            value(keys[b], depth + 1);
            value(vals[b], depth + 1);
            op('s');
          } else {
            op('(');
            for (size_t i = b; i < e; ++i) {
              value(keys[i], depth + 1);
              value(vals[i], depth + 1);
            }
            op('u');
          }
        }
        return;
      }
    }
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// save / load
// ---------------------------------------------------------------------------------------------

void save_torch_file(const PyValue& root, const std::string& path) {
  try {
    Pickler pickler;
    pickler.dump(root);
    AtomicFile file(path);
    // PyTorchStreamWriter throws from its destructor when a write came up short (its
    // writeEndOfFile runs there, during the unwinding: std::terminate). So the sink never
    // reports a short write to it: it keeps the first failure, drops what follows, and the
    // failure is thrown once the writer is gone.
    std::exception_ptr failure;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) -> size_t {
        if (!failure) {
          try {
            file.write(buf, n);
          } catch (...) {
            failure = std::current_exception();
          }
        }
        return n;
      });
      auto record = [&](const std::string& name, const void* data, size_t n) {
        if (!failure) writer.writeRecord(name, data, n);
      };
      record("data.pkl", pickler.out.data(), pickler.out.size());
      record(".format_version", "1", 1);
      record(".storage_alignment", "64", 2);
      record("byteorder", "little", 6);
      for (size_t k = 0; k < pickler.storages.size() && !failure; ++k) {
        at::Tensor t = pickler.storages[k].detach();
        if (!t.device().is_cpu()) t = t.to(at::kCPU);
        t = t.resolve_conj().resolve_neg();
        if (!t.is_contiguous()) t = t.contiguous();
        size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
        record("data/" + std::to_string(k), nbytes ? t.const_data_ptr() : nullptr, nbytes);
      }
      if (!failure) writer.writeEndOfFile();
    }
    if (failure) std::rethrow_exception(failure);
    file.commit();
  } catch (const std::exception& e) {
    throw CheckpointError("dscpp: cannot save torch file '" + path + "': " + error_text(e));
  }
}

}  // namespace dscpp::checkpoint
