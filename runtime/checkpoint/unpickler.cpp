// The unpickler of torch files' data.pkl: see unpickler.h.
#include "dscpp/runtime/checkpoint/unpickler.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/torch_format.h"

namespace dscpp::checkpoint::detail {

namespace {

// Unpickler: a graph of shared objects (memo entries alias what is filled in later), turned
// into PyValues at STOP.

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

const char* obj_kind(const Obj& o) {
  static const char* names[] = {"None",  "bool", "int",    "float",  "str",    "list",
                                "tuple", "dict", "Tensor", "global", "storage"};
  return names[o.k];
}

class Unpickler {
 public:
  Unpickler(const std::string& data, const StorageLoader& load) : data_(data), load_(load) {}
  // Every object is held by all_ as well: emptying each one's children first leaves nothing to
  // destroy recursively (a chain of 50,000 nested lists would overflow the stack), and breaks
  // the cycles a pickle can build through its memo.
  ~Unpickler() {
    for (auto& o : all_) {
      std::vector<ObjP>().swap(o->items);
      std::vector<ObjP>().swap(o->keys);
    }
  }
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  size_t pos() const { return pos_; }

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
          throw CheckpointError(std::string("data.pkl: ") + buf);
        }
      }
    }
  }

 private:
  const std::string& data_;
  const StorageLoader& load_;
  size_t pos_ = 0;
  std::vector<ObjP> all_;
  std::vector<ObjP> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, ObjP> memo_;
  std::map<std::string, at::Tensor> storages_;

  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError("data.pkl: " + what + " (near byte " + std::to_string(pos_) + ")");
  }
  ObjP make(Obj::K k) {
    auto o = std::make_shared<Obj>();
    o->k = k;
    all_.push_back(o);
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

  std::vector<int64_t> ints(const Obj& t, const char* what) const {
    if (t.k != Obj::Tuple && t.k != Obj::List) fail(std::string(what) + " is not a tuple");
    std::vector<int64_t> v;
    for (const auto& x : t.items) {
      if (x->k != Obj::Int) fail(std::string(what) + " not ints");
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
    if (numel < 0) fail("storage " + key + " has a negative size");
    at::Tensor s;
    try {
      s = load_(key, dtype, numel);
    } catch (const std::exception& e) {
      fail(error_text(e));
    }
    if (s.scalar_type() != dtype || s.dim() != 1 || s.numel() != numel)
      fail("storage " + key + " loaded with another dtype or size");
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
          if ((kv->k != Obj::Tuple && kv->k != Obj::List) || kv->items.size() != 2)
            fail("OrderedDict item is not a pair");
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

// The tree the graph stands for: at most kMaxDepth deep (the recursion here and in PyValue's
// destructor stays short) and kMaxValues values in all (a memo entry used twice at every level
// would stand for 2^levels values).
PyValue to_value(const Obj& o, int depth, size_t* budget) {
  if (depth > kMaxDepth)
    throw CheckpointError("data.pkl: values nested more than " + std::to_string(kMaxDepth) +
                          " deep (a cycle, or not a checkpoint)");
  if ((*budget)-- == 0)
    throw CheckpointError("data.pkl: stands for more than " + std::to_string(kMaxValues) +
                          " values (references repeated at every level?)");
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
      for (const auto& x : o.items) items.push_back(to_value(*x, depth + 1, budget));
      return o.k == Obj::List ? PyValue::list(std::move(items)) : PyValue::tuple(std::move(items));
    }
    case Obj::Dict: {
      PyValue d = PyValue::dict(o.ordered);
      for (size_t i = 0; i < o.keys.size(); ++i) {
        PyValue k = to_value(*o.keys[i], depth + 1, budget);
        d.push_entry(std::move(k), to_value(*o.items[i], depth + 1, budget));
      }
      return d;
    }
    case Obj::Global:
      throw CheckpointError("data.pkl: holds the bare global " + o.s + "." + o.s2);
    case Obj::Storage:
      throw CheckpointError("data.pkl: holds a bare storage");
  }
  return PyValue();
}

}  // namespace

PyValue unpickle(const std::string& data, const StorageLoader& load) {
  Unpickler u(data, load);
  try {
    ObjP root = u.load();
    size_t budget = kMaxValues;
    return to_value(*root, 0, &budget);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    // LibTorch's (or the standard library's) own words, placed.
    throw CheckpointError("data.pkl: " + error_text(e) + " (near byte " + std::to_string(u.pos()) +
                          ")");
  }
}

}  // namespace dscpp::checkpoint::detail
