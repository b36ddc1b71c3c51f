#include "runtime/checkpoint/torch_file.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace dscpp::checkpoint {

// ---------------------------------------------------------------------------------------------
// PyValue
// ---------------------------------------------------------------------------------------------

PyValue PyValue::list(std::vector<PyValue> items) {
  PyValue v;
  v.kind_ = Kind::List;
  v.items_ = std::move(items);
  return v;
}

PyValue PyValue::tuple(std::vector<PyValue> items) {
  PyValue v;
  v.kind_ = Kind::Tuple;
  v.items_ = std::move(items);
  return v;
}

PyValue PyValue::dict(bool ordered) {
  PyValue v;
  v.kind_ = Kind::Dict;
  v.ordered_ = ordered;
  return v;
}

const char* PyValue::kind_name() const {
  switch (kind_) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Double:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return ordered_ ? "OrderedDict" : "dict";
    case Kind::Tensor:
      return "Tensor";
  }
  return "?";
}

void PyValue::require(Kind k, const char* what) const {
  if (kind_ != k) {
    throw std::runtime_error(std::string("dscpp::checkpoint::PyValue: expected ") + what +
                             ", got " + kind_name());
  }
}

bool PyValue::as_bool() const {
  require(Kind::Bool, "bool");
  return int_ != 0;
}
int64_t PyValue::as_int() const {
  require(Kind::Int, "int");
  return int_;
}
double PyValue::as_double() const {
  if (kind_ == Kind::Int) return static_cast<double>(int_);
  require(Kind::Double, "float");
  return double_;
}
const std::string& PyValue::as_string() const {
  require(Kind::String, "str");
  return string_;
}
const at::Tensor& PyValue::as_tensor() const {
  require(Kind::Tensor, "Tensor");
  return tensor_;
}

const std::vector<PyValue>& PyValue::items() const {
  if (kind_ != Kind::List && kind_ != Kind::Tuple) require(Kind::List, "list or tuple");
  return items_;
}
std::vector<PyValue>& PyValue::items() {
  if (kind_ != Kind::List && kind_ != Kind::Tuple) require(Kind::List, "list or tuple");
  return items_;
}
PyValue& PyValue::append(PyValue v) {
  items().push_back(std::move(v));
  return *this;
}

bool PyValue::ordered() const {
  require(Kind::Dict, "dict");
  return ordered_;
}
size_t PyValue::size() const {
  if (kind_ == Kind::Dict) return keys_.size();
  return items().size();
}
const std::vector<PyValue>& PyValue::keys() const {
  require(Kind::Dict, "dict");
  return keys_;
}
const std::vector<PyValue>& PyValue::values() const {
  require(Kind::Dict, "dict");
  return items_;
}
std::vector<PyValue>& PyValue::values() {
  require(Kind::Dict, "dict");
  return items_;
}

bool PyValue::same_key(const PyValue& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::None:
      return true;
    case Kind::Bool:
    case Kind::Int:
      return int_ == o.int_;
    case Kind::Double:
      return double_ == o.double_;
    case Kind::String:
      return string_ == o.string_;
    case Kind::Tensor:
      return tensor_.unsafeGetTensorImpl() == o.tensor_.unsafeGetTensorImpl();
    default:
      return false;
  }
}

PyValue& PyValue::set(PyValue key, PyValue value) {
  require(Kind::Dict, "dict");
  if (!key.is_string() && !key.is_int()) {
    throw std::runtime_error(std::string("dscpp::checkpoint::PyValue: dict keys must be str or "
                                         "int, got ") +
                             key.kind_name());
  }
  if (PyValue* existing = find(key)) {
    *existing = std::move(value);
  } else {
    keys_.push_back(std::move(key));
    items_.push_back(std::move(value));
  }
  return *this;
}

void PyValue::push_entry(PyValue key, PyValue value) {
  require(Kind::Dict, "dict");
  keys_.push_back(std::move(key));
  items_.push_back(std::move(value));
}

const PyValue* PyValue::find(const PyValue& key) const {
  require(Kind::Dict, "dict");
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i].same_key(key)) return &items_[i];
  }
  return nullptr;
}
PyValue* PyValue::find(const PyValue& key) {
  return const_cast<PyValue*>(static_cast<const PyValue&>(*this).find(key));
}
const PyValue& PyValue::at(const PyValue& key) const {
  if (const PyValue* v = find(key)) return *v;
  std::string k = key.is_string() ? "'" + key.string_ + "'"
                  : key.is_int()  ? std::to_string(key.int_)
                                  : key.kind_name();
  throw std::runtime_error("dscpp::checkpoint::PyValue: no key " + k + " in dict");
}
PyValue& PyValue::at(const PyValue& key) {
  return const_cast<PyValue&>(static_cast<const PyValue&>(*this).at(key));
}

// ---------------------------------------------------------------------------------------------
// dtypes <-> torch.*Storage
// ---------------------------------------------------------------------------------------------

namespace {

struct StorageName {
  at::ScalarType dtype;
  const char* name;
};
constexpr StorageName kStorageNames[] = {
    {at::kFloat, "FloatStorage"},
    {at::kDouble, "DoubleStorage"},
    {at::kHalf, "HalfStorage"},
    {at::kBFloat16, "BFloat16Storage"},
    {at::kLong, "LongStorage"},
    {at::kInt, "IntStorage"},
    {at::kShort, "ShortStorage"},
    {at::kChar, "CharStorage"},
    {at::kByte, "ByteStorage"},
    {at::kBool, "BoolStorage"},
    {at::kComplexFloat, "ComplexFloatStorage"},
    {at::kComplexDouble, "ComplexDoubleStorage"},
};

const char* storage_name(at::ScalarType t) {
  for (const auto& s : kStorageNames) {
    if (s.dtype == t) return s.name;
  }
  throw std::runtime_error(std::string("cannot save a tensor of dtype ") + c10::toString(t));
}

bool storage_dtype(const std::string& name, at::ScalarType* out) {
  for (const auto& s : kStorageNames) {
    if (name == s.name) {
      *out = s.dtype;
      return true;
    }
  }
  if (name == "UntypedStorage") {
    *out = at::kByte;
    return true;
  }
  return false;
}

std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

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
    if (s.size() > 0xffffffffULL) throw std::runtime_error("string too long to pickle");
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
    if (!t.defined()) throw std::runtime_error("cannot save an undefined tensor");
    if (t.layout() != at::kStrided || t.is_quantized()) {
      throw std::runtime_error("can only save dense (strided) tensors");
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
    if (depth > kMaxDepth) throw std::runtime_error("value nested too deeply to pickle");
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

// ---------------------------------------------------------------------------------------------
// Unpickler: a graph of shared objects (memo entries alias what is filled in later), turned
// into PyValues at STOP.
// ---------------------------------------------------------------------------------------------

struct Obj;
using ObjP = std::shared_ptr<Obj>;
struct Obj {
  enum K { None, Bool, Int, Double, String, List, Tuple, Dict, Tensor, Global, Storage } k = None;
  bool ordered = false;
  bool object = false;  // a Python object read as a dict of its __dict__ plus "__class__"
  int64_t i = 0;
  double d = 0;
  std::string s, s2;  // string; Global: module, name
  std::vector<ObjP> items, keys;
  at::Tensor t;  // Tensor, or Storage (1-D)
};

ObjP make(Obj::K k) {
  auto o = std::make_shared<Obj>();
  o->k = k;
  return o;
}
ObjP make_int(int64_t i) {
  auto o = make(Obj::Int);
  o->i = i;
  return o;
}
ObjP make_str(std::string s) {
  auto o = make(Obj::String);
  o->s = std::move(s);
  return o;
}

const char* obj_kind(const Obj& o) {
  static const char* names[] = {"None",  "bool", "int",    "float",  "str",    "list",
                                "tuple", "dict", "Tensor", "global", "storage"};
  return names[o.k];
}

class Unpickler {
 public:
  Unpickler(const std::string& data, caffe2::serialize::PyTorchStreamReader& reader)
      : data_(data), reader_(reader) {}

  ObjP load() {
    for (;;) {
      size_t at_pos = pos_;
      uint8_t c = u8();
      switch (c) {
        case 0x80:
          u8();
          break;  // PROTO
        case 0x95:
          bytes(8);
          break;  // FRAME
        case '.':
          return pop();  // STOP
        case '(':
          marks_.push_back(stack_.size());
          break;
        case '}':
          stack_.push_back(make(Obj::Dict));
          break;
        case ']':
          stack_.push_back(make(Obj::List));
          break;
        case ')':
          stack_.push_back(make(Obj::Tuple));
          break;
        case 'l': {
          auto o = make(Obj::List);
          o->items = pop_mark();
          stack_.push_back(o);
          break;
        }
        case 't': {
          auto o = make(Obj::Tuple);
          o->items = pop_mark();
          stack_.push_back(o);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          size_t n = c - 0x84;
          need(n);
          auto o = make(Obj::Tuple);
          o->items.assign(stack_.end() - n, stack_.end());
          stack_.resize(stack_.size() - n);
          stack_.push_back(o);
          break;
        }
        case 'a': {
          ObjP v = pop();
          list_top()->items.push_back(v);
          break;
        }
        case 'e': {
          auto vs = pop_mark();
          auto& l = list_top()->items;
          l.insert(l.end(), vs.begin(), vs.end());
          break;
        }
        case 'd': {
          auto vs = pop_mark();
          auto o = make(Obj::Dict);
          add_items(*o, vs);
          stack_.push_back(o);
          break;
        }
        case 's': {
          ObjP v = pop();
          ObjP k = pop();
          add_items(*dict_top(), {k, v});
          break;
        }
        case 'u': {
          auto vs = pop_mark();
          add_items(*dict_top(), vs);
          break;
        }
        case 'q':
          memo_[u8()] = top();
          break;
        case 'r':
          memo_[static_cast<uint32_t>(le(4))] = top();
          break;
        case 0x94:
          memo_[static_cast<uint32_t>(memo_.size())] = top();
          break;
        case 'h':
          stack_.push_back(memo_get(u8()));
          break;
        case 'j':
          stack_.push_back(memo_get(static_cast<uint32_t>(le(4))));
          break;
        case 'J':
          stack_.push_back(make_int(static_cast<int32_t>(static_cast<uint32_t>(le(4)))));
          break;
        case 'K':
          stack_.push_back(make_int(u8()));
          break;
        case 'M':
          stack_.push_back(make_int(static_cast<int64_t>(le(2))));
          break;
        case 0x8a:
          stack_.push_back(make_int(long_bytes(u8())));
          break;
        case 0x8b:
          stack_.push_back(make_int(long_bytes(le(4))));
          break;
        case 'G': {
          std::string b = bytes(8);
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(b[k]);
          auto o = make(Obj::Double);
          std::memcpy(&o->d, &bits, 8);
          stack_.push_back(o);
          break;
        }
        case 'X':
          stack_.push_back(make_str(bytes(le(4))));
          break;
        case 0x8c:
          stack_.push_back(make_str(bytes(u8())));
          break;
        case 0x8d:
          stack_.push_back(make_str(bytes(le(8))));
          break;
        case 'C':
          stack_.push_back(make_str(bytes(u8())));
          break;  // bytes read as str
        case 'B':
          stack_.push_back(make_str(bytes(le(4))));
          break;  // bytes read as str
        case 0x8e:
          stack_.push_back(make_str(bytes(le(8))));
          break;
        case 'N':
          stack_.push_back(make(Obj::None));
          break;
        case 0x88:
        case 0x89: {
          auto o = make(Obj::Bool);
          o->i = c == 0x88;
          stack_.push_back(o);
          break;
        }
        case 'c': {
          auto o = make(Obj::Global);
          o->s = line();
          o->s2 = line();
          stack_.push_back(o);
          break;
        }
        case 0x93: {
          ObjP name = pop();
          ObjP module = pop();
          if (name->k != Obj::String || module->k != Obj::String) fail("STACK_GLOBAL of non-str");
          auto o = make(Obj::Global);
          o->s = module->s;
          o->s2 = name->s;
          stack_.push_back(o);
          break;
        }
        case 'R':
        case 0x81: {  // REDUCE, NEWOBJ
          ObjP args = pop();
          ObjP fn = pop();
          stack_.push_back(call(fn, args, c == 0x81));
          break;
        }
        case 'Q':
          stack_.push_back(persistent(pop()));
          break;
        case 'b': {  // BUILD
          ObjP state = pop();
          ObjP target = top();
          build(*target, *state);
          break;
        }
        case '0':
          pop();
          break;
        case '1':
          pop_mark();
          break;
        case '2':
          stack_.push_back(top());
          break;
        default: {
          char buf[64];
          std::snprintf(buf, sizeof buf, "unsupported pickle opcode 0x%02x at byte %zu", c, at_pos);
          throw std::runtime_error(buf);
        }
      }
    }
  }

 private:
  const std::string& data_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  size_t pos_ = 0;
  std::vector<ObjP> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, ObjP> memo_;
  std::map<std::string, at::Tensor> storages_;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("data.pkl: " + what + " (near byte " + std::to_string(pos_) + ")");
  }
  uint8_t u8() {
    if (pos_ >= data_.size()) fail("pickle ends before STOP (truncated)");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t le(int n) {
    if (data_.size() - pos_ < static_cast<size_t>(n)) fail("pickle truncated");
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(data_[pos_ + k]);
    pos_ += n;
    return v;
  }
  std::string bytes(uint64_t n) {
    if (data_.size() - pos_ < n) fail("pickle truncated");
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    size_t e = data_.find('\n', pos_);
    if (e == std::string::npos) fail("pickle truncated in GLOBAL");
    std::string s = data_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }
  int64_t long_bytes(uint64_t n) {
    if (n > 8) fail("integer wider than 64 bits");
    if (n == 0) return 0;
    std::string b = bytes(n);
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(b[k]);
    if (n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }
  void need(size_t n) const {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() < floor + n) fail("pickle stack underflow");
  }
  ObjP pop() {
    need(1);
    ObjP o = stack_.back();
    stack_.pop_back();
    return o;
  }
  ObjP top() {
    need(1);
    return stack_.back();
  }
  std::vector<ObjP> pop_mark() {
    if (marks_.empty()) fail("MARK expected");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<ObjP> v(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return v;
  }
  ObjP memo_get(uint32_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo key " + std::to_string(k) + " not found");
    return it->second;
  }
  ObjP list_top() {
    ObjP o = top();
    if (o->k != Obj::List) fail(std::string("APPEND to ") + obj_kind(*o));
    return o;
  }
  ObjP dict_top() {
    ObjP o = top();
    if (o->k != Obj::Dict) fail(std::string("SETITEM on ") + obj_kind(*o));
    return o;
  }
  void add_items(Obj& d, const std::vector<ObjP>& kv) {
    if (kv.size() % 2) fail("odd number of dict items");
    for (size_t i = 0; i < kv.size(); i += 2) {
      d.keys.push_back(kv[i]);
      d.items.push_back(kv[i + 1]);
    }
  }

  static std::vector<int64_t> ints(const Obj& t, const char* what) {
    if (t.k != Obj::Tuple && t.k != Obj::List) {
      throw std::runtime_error(std::string("data.pkl: ") + what + " is not a tuple");
    }
    std::vector<int64_t> v;
    for (const auto& x : t.items) {
      if (x->k != Obj::Int)
        throw std::runtime_error(std::string("data.pkl: ") + what + " not ints");
      v.push_back(x->i);
    }
    return v;
  }

  ObjP persistent(const ObjP& pid) {
    // ('storage', torch.FloatStorage, key, location, numel)
    if (pid->k != Obj::Tuple || pid->items.size() != 5 || pid->items[0]->k != Obj::String ||
        pid->items[0]->s != "storage" || pid->items[1]->k != Obj::Global ||
        pid->items[2]->k != Obj::String || pid->items[4]->k != Obj::Int) {
      fail(
          "unsupported persistent id (expected ('storage', torch.*Storage, key, location, numel))");
    }
    at::ScalarType dtype;
    const Obj& cls = *pid->items[1];
    if (cls.s != "torch" || !storage_dtype(cls.s2, &dtype)) {
      fail("unsupported storage type " + cls.s + "." + cls.s2);
    }
    const std::string& key = pid->items[2]->s;
    int64_t numel = pid->items[4]->i;
    auto o = make(Obj::Storage);
    auto it = storages_.find(key);
    if (it != storages_.end()) {
      o->t = it->second;
      if (o->t.scalar_type() != dtype) fail("storage " + key + " read with two dtypes");
      return o;
    }
    const std::string name = "data/" + key;
    if (!reader_.hasRecord(name)) fail("record " + name + " is missing");
    size_t size = reader_.getRecordSize(name);
    size_t elem = c10::elementSize(dtype);
    if (numel < 0 || static_cast<size_t>(numel) > size / elem ||
        size != static_cast<size_t>(numel) * elem) {
      fail("record " + name + " holds " + std::to_string(size) + " bytes, expected " +
           std::to_string(numel) + " x " + std::to_string(elem));
    }
    at::Tensor s = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (size > 0) reader_.getRecord(name, s.data_ptr(), size);
    storages_.emplace(key, s);
    o->t = s;
    return o;
  }

  ObjP rebuild_tensor(const std::vector<ObjP>& a, bool v2) {
    if (a.size() < 4 || a[0]->k != Obj::Storage || a[1]->k != Obj::Int) {
      fail("bad arguments to _rebuild_tensor");
    }
    const at::Tensor& storage = a[0]->t;
    std::vector<int64_t> size = ints(*a[2], "tensor size");
    std::vector<int64_t> stride = ints(*a[3], "tensor stride");
    int64_t offset = a[1]->i;
    if (size.size() != stride.size()) fail("tensor size and stride differ in length");
    // The largest element the view touches must lie inside the storage.
    int64_t last = offset;
    int64_t step = 0;
    bool empty = false;
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] < 0 || stride[d] < 0) fail("negative tensor size or stride");
      if (size[d] == 0) {
        empty = true;
      } else if (__builtin_mul_overflow(size[d] - 1, stride[d], &step) ||
                 __builtin_add_overflow(last, step, &last)) {
        fail("tensor size and stride overflow");
      }
    }
    if (offset < 0 || (!empty && last >= storage.numel())) fail("tensor view exceeds its storage");
    auto o = make(Obj::Tensor);
    o->t = storage.as_strided(size, stride, offset);
    if (v2 && a.size() >= 5 && a[4]->k == Obj::Bool && a[4]->i &&
        at::isFloatingType(o->t.scalar_type())) {
      o->t.requires_grad_(true);
    }
    return o;
  }

  // BUILD: an object's state goes into its dict; an OrderedDict's __dict__ (a state_dict's
  // _metadata) and a tensor's state are dropped.
  void build(Obj& target, const Obj& state) {
    if (target.k == Obj::Tensor || (target.k == Obj::Dict && !target.object)) return;
    if (target.k != Obj::Dict) fail(std::string("BUILD on ") + obj_kind(target));
    auto merge = [&](const Obj& d) {
      if (d.k == Obj::None) return;
      if (d.k != Obj::Dict) fail(std::string("BUILD with a ") + obj_kind(d) + " state");
      target.keys.insert(target.keys.end(), d.keys.begin(), d.keys.end());
      target.items.insert(target.items.end(), d.items.begin(), d.items.end());
    };
    if (state.k == Obj::Tuple && state.items.size() == 2) {  // (__dict__, __slots__ state)
      merge(*state.items[0]);
      merge(*state.items[1]);
    } else {
      merge(state);
    }
  }

  ObjP call(const ObjP& fn, const ObjP& args, bool newobj) {
    if (fn->k != Obj::Global) fail(std::string("REDUCE on ") + obj_kind(*fn));
    if (args->k != Obj::Tuple) fail("REDUCE arguments are not a tuple");
    const std::string name = fn->s + "." + fn->s2;
    const auto& a = args->items;
    if (name == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(a, true);
    if (name == "torch._utils._rebuild_tensor") return rebuild_tensor(a, false);
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->k != Obj::Tensor) fail("bad arguments to " + name);
      auto o = make(Obj::Tensor);
      o->t = a[0]->t;
      if (a.size() > 1 && a[1]->k == Obj::Bool && a[1]->i &&
          at::isFloatingType(o->t.scalar_type()) && !o->t.requires_grad()) {
        o->t = o->t.detach().requires_grad_(true);
      }
      return o;
    }
    if (name == "collections.OrderedDict") {
      auto o = make(Obj::Dict);
      o->ordered = true;
      if (!a.empty()) {
        for (const auto& kv : a[0]->items) {
          if (kv->items.size() != 2) fail("OrderedDict item is not a pair");
          o->keys.push_back(kv->items[0]);
          o->items.push_back(kv->items[1]);
        }
      }
      return o;
    }
    if (name == "torch.Size") {
      auto o = make(Obj::Tuple);
      if (!a.empty()) o->items = a[0]->items;
      return o;
    }
    if (name == "torch.device") {
      if (a.empty() || a[0]->k != Obj::String) fail("bad arguments to torch.device");
      std::string d = a[0]->s;
      if (a.size() > 1 && a[1]->k == Obj::Int) d += ":" + std::to_string(a[1]->i);
      return make_str(d);
    }
    // Enum members: Python >= 3.11 pickles them as getattr(Class, "name"). DeepSpeed's
    // ZeroStageEnum reads as its int value, any other as "Class.name".
    if (name == "__builtin__.getattr" || name == "builtins.getattr") {
      if (a.size() != 2 || a[0]->k != Obj::Global || a[1]->k != Obj::String) {
        fail("unsupported getattr call");
      }
      if (a[0]->s2 == "ZeroStageEnum") {
        static const std::map<std::string, int64_t> stages = {{"disabled", 0},
                                                              {"optimizer_states", 1},
                                                              {"gradients", 2},
                                                              {"weights", 3},
                                                              {"max_stage", 3}};
        auto it = stages.find(a[1]->s);
        if (it != stages.end()) return make_int(it->second);
      }
      return make_str(a[0]->s2 + "." + a[1]->s);
    }
    // Other objects (DeepSpeed's LossScaler, fragment_address) pickle as cls.__new__(cls) and
    // BUILD: read as a dict {"__class__": "module.Class", **state}.
    if (newobj && a.empty() && fn->s.rfind("torch", 0) != 0 && fn->s != "builtins" &&
        fn->s != "__builtin__") {
      auto o = make(Obj::Dict);
      o->object = true;
      o->keys.push_back(make_str("__class__"));
      o->items.push_back(make_str(name));
      return o;
    }
    // Older Pythons pickle an enum member as Class(value): read its value.
    if (a.size() == 1 && fn->s.rfind("torch", 0) != 0 && fn->s != "builtins" &&
        (a[0]->k == Obj::Int || a[0]->k == Obj::String || a[0]->k == Obj::Double) &&
        fn->s2.size() >= 4 && fn->s2.compare(fn->s2.size() - 4, 4, "Enum") == 0) {
      return a[0];
    }
    fail("unsupported global " + name);
  }
};

PyValue to_value(const Obj& o, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("data.pkl: value nested too deeply (a cycle?)");
  switch (o.k) {
    case Obj::None:
      return PyValue();
    case Obj::Bool:
      return PyValue(o.i != 0);
    case Obj::Int:
      return PyValue(o.i);
    case Obj::Double:
      return PyValue(o.d);
    case Obj::String:
      return PyValue(o.s);
    case Obj::Tensor:
      return PyValue(o.t);
    case Obj::List:
    case Obj::Tuple: {
      std::vector<PyValue> items;
      items.reserve(o.items.size());
      for (const auto& x : o.items) items.push_back(to_value(*x, depth + 1));
      return o.k == Obj::List ? PyValue::list(std::move(items)) : PyValue::tuple(std::move(items));
    }
    case Obj::Dict: {
      PyValue d = PyValue::dict(o.ordered);
      for (size_t i = 0; i < o.keys.size(); ++i) {
        d.push_entry(to_value(*o.keys[i], depth + 1), to_value(*o.items[i], depth + 1));
      }
      return d;
    }
    case Obj::Global:
      throw std::runtime_error("data.pkl: holds the bare global " + o.s + "." + o.s2);
    case Obj::Storage:
      throw std::runtime_error("data.pkl: holds a bare storage");
  }
  return PyValue();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// save / load
// ---------------------------------------------------------------------------------------------

void save_torch_file(const PyValue& root, const std::string& path) {
  const std::string tmp = path + ".tmp";
  FILE* f = nullptr;
  try {
    Pickler pickler;
    pickler.dump(root);

    f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
    {
      caffe2::serialize::PyTorchStreamWriter writer(
          [f](const void* buf, size_t n) -> size_t { return std::fwrite(buf, 1, n, f); });
      writer.writeRecord("data.pkl", pickler.out.data(), pickler.out.size());
      writer.writeRecord(".format_version", "1", 1);
      writer.writeRecord(".storage_alignment", "64", 2);
      writer.writeRecord("byteorder", "little", 6);
      for (size_t k = 0; k < pickler.storages.size(); ++k) {
        at::Tensor t = pickler.storages[k].detach();
        if (!t.device().is_cpu()) t = t.to(at::kCPU);
        t = t.resolve_conj().resolve_neg();
        if (!t.is_contiguous()) t = t.contiguous();
        size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
        writer.writeRecord("data/" + std::to_string(k), nbytes ? t.const_data_ptr() : nullptr,
                           nbytes);
      }
      writer.writeEndOfFile();
    }
    if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) {
      throw std::runtime_error(std::string("cannot flush ") + tmp + ": " + std::strerror(errno));
    }
    FILE* g = f;
    f = nullptr;
    if (std::fclose(g) != 0) {
      throw std::runtime_error(std::string("cannot close ") + tmp + ": " + std::strerror(errno));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw std::runtime_error("cannot rename " + tmp + ": " + ec.message());
    std::string dir = std::filesystem::path(path).parent_path().string();
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  } catch (const std::exception& e) {
    if (f) std::fclose(f);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("dscpp: cannot save torch file '" + path + "': " + error_text(e));
  }
}

PyValue load_torch_file(const std::string& path) {
  try {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw std::runtime_error("no such file");
    }
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (reader.hasRecord("byteorder")) {
      auto [ptr, n] = reader.getRecord("byteorder");
      std::string order(static_cast<const char*>(ptr.get()), n);
      if (order != "little") throw std::runtime_error("byteorder '" + order + "' not supported");
    }
    if (!reader.hasRecord("data.pkl")) throw std::runtime_error("no data.pkl record");
    auto [ptr, n] = reader.getRecord("data.pkl");
    std::string pkl(static_cast<const char*>(ptr.get()), n);
    Unpickler u(pkl, reader);
    ObjP root = u.load();
    return to_value(*root, 0);
  } catch (const std::exception& e) {
    throw std::runtime_error("dscpp: cannot read torch file '" + path + "': " + error_text(e));
  }
}

}  // namespace dscpp::checkpoint
