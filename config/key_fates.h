// What dscpp does with every key the config reader resolves ("nothing silent"):
// acted on (with the test that shows its effect), acted on with no effect test yet, refused
// with an error naming it, or announced once at start-up as not acted on. The table is the
// one place this is written down; tests/config/test_key_fates.cpp fails on a resolved key
// missing from it, on an entry the reader never resolves, and on a named test that does not
// exist. docs/config.md lists the same fates for readers. The keys among them that set ZeRO's
// options are mapped to those options, each once, in runtime/engine/zero_options_from.cpp.
#pragma once

#include <string>
#include <vector>

#include "dscpp/config/section.h"

namespace dscpp::config {

enum class Fate {
  kActedOn,        // detail: the test (gtest Suite.Name or ctest name) that shows the effect
  kActedUntested,  // the engine reads it; detail says where; no test isolates its effect yet
  kRefused,        // detail: what is refused; example: a value that is refused
  kAnnounced,      // detail: why it changes nothing here; example: a value that is announced
};

struct KeyFate {
  const char* path;  // dotted JSON path, under its canonical name (aliases map onto it)
  Fate fate;
  const char* detail;
  const char* example;  // JSON text (kRefused, kAnnounced), else nullptr
  const char* inert;    // kAnnounced: JSON text of the value that is what dscpp does anyway
                        // (not announced); nullptr: any given value is announced
  bool by_engine;       // kAnnounced: the engine's start-up list (engine_gaps) announces it
};

const std::vector<KeyFate>& key_fates();

// The canonical path of a resolved key: bfloat16.* reads as bf16.*, ZeRO's pydantic
// aliases (prefetch_bucket_size, ...) as their stage3_ names.
std::string canonical_key(const std::string& path);

// The entry for a path (canonical_key applied), or nullptr.
const KeyFate* find_key_fate(const std::string& path);

// Adds to diag.ignored one line for each key of `source` whose fate is kAnnounced, that is
// given (not "auto"), is not its inert value, lies in no section switched off with
// "enabled": false, and is not already announced (itself or a section above it).
void announce_unused_keys(const nlohmann::json& source, Diagnostics& diag);

}  // namespace dscpp::config
