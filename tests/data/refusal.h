// What the data refusal tests share: the DataError a call throws, and a substring check.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "dscpp/data/data_error.h"

namespace dscpp::data::testing {

// The DataError `f` throws; fails the test if it throws nothing or something else.
template <typename F>
DataError refusal(F f) {
  try {
    f();
  } catch (const DataError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a DataError: " << e.what();
    return DataError("?", e.what());
  }
  ADD_FAILURE() << "nothing thrown";
  return DataError("?", "nothing thrown");
}

inline bool has(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

}  // namespace dscpp::data::testing
