// PyValue: the Python values a torch file holds (see torch_file.h).
#include <stdexcept>

#include "dscpp/error.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

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

PyValue PyValue::size(const std::vector<int64_t>& dims) {
  PyValue v;
  v.kind_ = Kind::Tuple;
  v.torch_size_ = true;
  for (int64_t d : dims) v.items_.emplace_back(d);
  return v;
}

PyValue PyValue::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return PyValue();
    case nlohmann::json::value_t::boolean:
      return PyValue(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return PyValue(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return PyValue(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return PyValue(j.get<double>());
    case nlohmann::json::value_t::string:
      return PyValue(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      PyValue out = list();
      for (const auto& x : j) out.append(from_json(x));
      return out;
    }
    case nlohmann::json::value_t::object: {
      PyValue out = dict();
      for (const auto& [k, x] : j.items()) out.push_entry(PyValue(k), from_json(x));
      return out;
    }
    default:
      return PyValue();
  }
}

nlohmann::json PyValue::to_json() const {
  switch (kind_) {
    case Kind::None:
      return nullptr;
    case Kind::Bool:
      return int_ != 0;
    case Kind::Int:
      return int_;
    case Kind::Double:
      return double_;
    case Kind::String:
      return string_;
    case Kind::List:
    case Kind::Tuple: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& x : items_) out.push_back(x.to_json());
      return out;
    }
    case Kind::Dict: {
      nlohmann::json out = nlohmann::json::object();
      for (size_t i = 0; i < keys_.size(); ++i) {
        const PyValue& k = keys_[i];
        out[k.is_string() ? k.string_ : std::to_string(k.as_int())] = items_[i].to_json();
      }
      return out;
    }
    case Kind::Tensor:
      break;
  }
  throw dscpp::Error("a tensor has no JSON form");
}

std::vector<int64_t> PyValue::as_ints() const {
  if (kind_ != Kind::List && kind_ != Kind::Tuple) require(Kind::Tuple, "a tuple of ints");
  std::vector<int64_t> out;
  for (const auto& x : items_) out.push_back(x.as_int());
  return out;
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
    throw dscpp::Error(std::string("dscpp::checkpoint::PyValue: expected ") + what + ", got " +
                       kind_name());
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
    throw dscpp::Error(std::string("dscpp::checkpoint::PyValue: dict keys must be str or "
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
  throw dscpp::Error("dscpp::checkpoint::PyValue: no key " + k + " in dict");
}
PyValue& PyValue::at(const PyValue& key) {
  return const_cast<PyValue&>(static_cast<const PyValue&>(*this).at(key));
}

}  // namespace dscpp::checkpoint
