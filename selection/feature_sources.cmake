# The sources of feature extraction, for every CMake project that compiles
# them: selection/CMakeLists.txt (the coverage_selection library) and
# fuzz/CMakeLists.txt (which compiles sources straight from their folders).
#
#   include(<path>/selection/feature_sources.cmake)
#   coverage_feature_sources(SOURCES)   # then add ${SOURCES} to one target
#
# feature_tables.json is compiled in: the caller adds it to its target with
# coverage_embed_file (cmake/embed.cmake) as
# coverage::selection::detail::kFeatureTablesJson.
function(coverage_feature_sources out_var)
  set(dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set(${out_var}
      ${dir}/config_reader.cc
      ${dir}/extract_activation.cc
      ${dir}/extract_attention.cc
      ${dir}/extract_dims.cc
      ${dir}/extract_norm.cc
      ${dir}/extract_numerics.cc
      ${dir}/extract_structure.cc
      ${dir}/family_defaults.cc
      ${dir}/feature_tables.cc
      ${dir}/features.cc
      ${dir}/features_json.cc
      PARENT_SCOPE)
endfunction()
