// The --world_info value a runner hands every per-node launcher: the active resources as
// JSON {"host": [slot, ...], ...} in rank order, URL-safe base64 encoded. The encoding is
// byte-identical to DeepSpeed's (json.dumps + urlsafe_b64encode), so the same string decodes
// on either side.
#pragma once

#include <stdexcept>
#include <string>

#include "resources.h"

namespace dscpp::launcher {

class WorldInfoError : public UserError {
 public:
  using UserError::UserError;
};

std::string world_info_json(const ActiveResources& active);
std::string encode_world_info(const ActiveResources& active);

// Accepts both base64 alphabets, with or without padding. Throws WorldInfoError.
ActiveResources decode_world_info(const std::string& encoded);

std::string base64_urlsafe_encode(const std::string& bytes);
std::string base64_decode(const std::string& text);

}  // namespace dscpp::launcher
