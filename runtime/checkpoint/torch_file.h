// Reading and writing `.pt` files in torch.save's zip layout, so that Python's torch.load opens
// what we write at its defaults (weights_only=True) and we read what torch.save wrote.
//
// What a DeepSpeed checkpoint holds is a tree of Python values: None, bool, int, float, str,
// list, tuple, dict / OrderedDict (string or int keys) and tensors. PyValue is that tree.
// save_torch_file writes it record by record (data.pkl, .format_version, .storage_alignment,
// byteorder, data/<key> per tensor, version, .data/serialization_id), each tensor as its own
// compact CPU storage, into `path + ".tmp"`, fsyncs it and renames it over `path`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dscpp::checkpoint {

class PyValue {
 public:
  enum class Kind { None, Bool, Int, Double, String, List, Tuple, Dict, Tensor };

  PyValue() = default;  // None
  PyValue(std::nullptr_t) {}
  PyValue(bool b) : kind_(Kind::Bool), int_(b ? 1 : 0) {}
  template <typename I,
            std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  PyValue(I i) : kind_(Kind::Int), int_(static_cast<int64_t>(i)) {}
  PyValue(double d) : kind_(Kind::Double), double_(d) {}
  PyValue(float f) : kind_(Kind::Double), double_(f) {}
  PyValue(const char* s) : kind_(Kind::String), string_(s) {}
  PyValue(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
  PyValue(std::string_view s) : kind_(Kind::String), string_(s) {}
  PyValue(at::Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}

  static PyValue list(std::vector<PyValue> items = {});
  static PyValue tuple(std::vector<PyValue> items = {});
  // A torch.Size: a tuple of ints that pickles as torch.Size (DeepSpeed's param_shapes).
  static PyValue size(const std::vector<int64_t>& dims);
  // JSON's values as Python's: objects become dicts, arrays lists. Throws on nothing.
  static PyValue from_json(const nlohmann::json& j);
  // A dict; ordered=true pickles as collections.OrderedDict (what state_dict() returns).
  static PyValue dict(bool ordered = false);
  static PyValue ordered_dict() { return dict(true); }

  Kind kind() const { return kind_; }
  const char* kind_name() const;
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_double() const { return kind_ == Kind::Double; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::Tuple; }
  bool is_torch_size() const { return kind_ == Kind::Tuple && torch_size_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }

  // Accessors throw std::runtime_error on a kind mismatch.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  // also accepts an int
  const std::string& as_string() const;
  const at::Tensor& as_tensor() const;

  // List or tuple.
  const std::vector<PyValue>& items() const;
  std::vector<PyValue>& items();
  PyValue& append(PyValue v);  // returns *this so calls chain

  // Dict: insertion-ordered; keys are strings or ints.
  bool ordered() const;
  size_t size() const;  // items of a list/tuple, entries of a dict
  const std::vector<PyValue>& keys() const;
  const std::vector<PyValue>& values() const;
  std::vector<PyValue>& values();
  PyValue& set(PyValue key, PyValue value);  // replaces an equal key; returns *this
  const PyValue* find(const PyValue& key) const;
  PyValue* find(const PyValue& key);
  bool contains(const PyValue& key) const { return find(key) != nullptr; }
  const PyValue& at(const PyValue& key) const;  // throws if absent
  PyValue& at(const PyValue& key);
  // Adds without looking for an equal key (the unpickler's SETITEMS).
  void push_entry(PyValue key, PyValue value);

  // The value as JSON (tuples as arrays, int dict keys as strings); throws
  // std::runtime_error naming the first tensor met, which JSON cannot hold.
  nlohmann::json to_json() const;
  // A list or tuple of ints (torch.Size included) as a vector; throws otherwise.
  std::vector<int64_t> as_ints() const;

  // Same kind and value; tensors compare by identity of their TensorImpl.
  bool same_key(const PyValue& other) const;

 private:
  void require(Kind k, const char* what) const;

  Kind kind_ = Kind::None;
  bool ordered_ = false;
  bool torch_size_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  std::vector<PyValue> items_;  // list/tuple items, or dict values
  std::vector<PyValue> keys_;   // dict keys
  at::Tensor tensor_;
};

// Writes `root` as torch.save would (pickle protocol 2, zip archive, 64-byte aligned records).
// Tensors go to the CPU and are stored compactly (a view's storage is only its own elements).
// Atomic: writes `path + ".tmp"`, fsyncs, renames. Throws std::runtime_error naming `path`.
void save_torch_file(const PyValue& root, const std::string& path);

// Reads a torch.save zip archive (ours or Python's). Tensors come back on the CPU; views that
// shared a storage in the file share it again. torch.Size reads as a tuple, torch.device as its
// string ("cpu", "cuda:0"), nn.Parameter as its tensor, DeepSpeed's ZeroStageEnum as its int
// (other enums as "Class.member"), bytes as a str, and a plain Python object (DeepSpeed's
// LossScaler, fragment_address) as a dict {"__class__": "module.Class", **its __dict__}; an
// OrderedDict's _metadata is dropped. Throws CheckpointError naming `path` and the place in it
// (record, byte) on a missing, truncated or corrupt file, on a value nested deeper than 1000
// levels or standing for more than 2^20 values, or on anything outside what checkpoints
// hold.
PyValue load_torch_file(const std::string& path);

}  // namespace dscpp::checkpoint
