# Model configs as YAML (config/yaml_text.cpp through yaml-cpp, which is not instrumented) and
# what GPTConfig makes of them (model_zoo/gpt_config.cpp and nn/fp8_recipe.cpp, no LibTorch). Seeds in
# corpus/model_config/: the seed's two YAML configs and a flat one.
set(cdir ${PROJECT_SOURCE_DIR}/config)
set(mdir ${PROJECT_SOURCE_DIR}/model_zoo)
dscpp_add_fuzzer(model_config
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_model_config.cpp ${cdir}/json_text.cpp
          ${cdir}/yaml_text.cpp ${cdir}/json_bounds.cpp ${cdir}/section.cpp
          ${mdir}/gpt_config.cpp ${mdir}/moe_config.cpp ${mdir}/parallelism_config.cpp
          ${PROJECT_SOURCE_DIR}/nn/fp8_recipe.cpp
  LAYERS config model_zoo nn ops
  LINK nlohmann_json::nlohmann_json fmt::fmt-header-only yaml-cpp)
