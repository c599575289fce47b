# coverage_embed_file(<target> <file> <header> <namespace> <kName>): compiles
# <file>'s bytes into <target> as `constinit const std::string_view <kName>`
# in <namespace>, declared in <header>; editing the file rebuilds it. The one
# way this project compiles a data file in (the report's CSS and JavaScript,
# selection's feature tables); included by the top-level CMakeLists.txt and
# by fuzz/CMakeLists.txt.
function(coverage_embed_file target input header namespace name)
  set(script ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_file.cmake)
  set(output ${CMAKE_CURRENT_BINARY_DIR}/embedded/${name}.cc)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${input} -DOUTPUT=${output} -DINCLUDE=${header} -DNAMESPACE=${namespace}
            -DNAME=${name} -P ${script}
    DEPENDS ${input} ${script}
    COMMENT "Embedding ${input}"
    VERBATIM)
  target_sources(${target} PRIVATE ${output})
endfunction()
