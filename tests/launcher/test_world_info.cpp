#include <gtest/gtest.h>

#include "world_info.h"

namespace dscpp::launcher {
namespace {

// Expected strings come from DeepSpeed's encode_world_info (json.dumps + urlsafe_b64encode).
TEST(WorldInfo, EncodingMatchesDeepSpeed) {
  const ActiveResources two = {{"worker-0", {0, 1}}, {"worker-1", {0, 2}}};
  EXPECT_EQ(world_info_json(two), R"({"worker-0": [0, 1], "worker-1": [0, 2]})");
  EXPECT_EQ(encode_world_info(two), "eyJ3b3JrZXItMCI6IFswLCAxXSwgIndvcmtlci0xIjogWzAsIDJdfQ==");
  EXPECT_EQ(encode_world_info({{"localhost", {0}}}), "eyJsb2NhbGhvc3QiOiBbMF19");
  EXPECT_EQ(encode_world_info({{"h\xc3\xa9\"x", {1}}}), "eyJoXHUwMGU5XCJ4IjogWzFdfQ==");
}

TEST(WorldInfo, RoundTripKeepsOrder) {
  const ActiveResources world = {{"zeta", {3, 1}}, {"alpha", {0}}, {"h\xc3\xa9\"x", {}}};
  EXPECT_EQ(decode_world_info(encode_world_info(world)), world);
}

TEST(WorldInfo, DecodesStandardAlphabetAndMissingPadding) {
  EXPECT_EQ(decode_world_info("eyJsb2NhbGhvc3QiOiBbMF19"), (ActiveResources{{"localhost", {0}}}));
  const std::string unpadded = "eyJ3b3JrZXItMCI6IFswLCAxXSwgIndvcmtlci0xIjogWzAsIDJdfQ";
  EXPECT_EQ(decode_world_info(unpadded).size(), 2u);
}

TEST(WorldInfo, RejectsGarbage) {
  EXPECT_THROW(decode_world_info("not base64!"), WorldInfoError);
  EXPECT_THROW(decode_world_info(base64_urlsafe_encode("{\"a\": [0,]}")), WorldInfoError);
  EXPECT_THROW(decode_world_info(base64_urlsafe_encode("[1]")), WorldInfoError);
  EXPECT_THROW(decode_world_info(base64_urlsafe_encode("{\"a\": [0]} x")), WorldInfoError);
}

}  // namespace
}  // namespace dscpp::launcher
