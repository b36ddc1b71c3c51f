# The config reader (config/, layer 1, no LibTorch) compiled with the sanitizers.
set(dir ${PROJECT_SOURCE_DIR}/config)
dscpp_add_fuzzer(config
  SOURCES fuzz_config.cpp ${dir}/json_text.cpp ${dir}/yaml_text.cpp ${dir}/json_bounds.cpp ${dir}/section.cpp
          ${dir}/ds_config.cpp ${dir}/features.cpp ${dir}/key_fates.cpp ${dir}/config_json.cpp
  LAYERS config
  LINK nlohmann_json::nlohmann_json fmt::fmt-header-only yaml-cpp)
