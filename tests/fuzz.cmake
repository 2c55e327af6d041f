# Coverage-guided fuzzing (libFuzzer) of the code that reads untrusted input:
# the job spec (api/jobspec.c), safetensors headers (worker/safetensors.c), the
# tokenizer.json loader (data/tok_bpe.c) and loomd's HTTP request path (a real
# loomd inside the fuzzer, tests/fuzz/fuzz_http.c).
# Needs clang: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang
#   -DCMAKE_CXX_COMPILER=clang++ -DLOOM_FUZZ=ON -DLOOM_CUDA=OFF
# Each ctest (label fuzz) runs one target for LOOM_FUZZ_SECONDS on its
# checked-in corpus (tests/fuzz/corpus/*). Without LOOM_FUZZ or clang, the
# test fuzz.libfuzzer reports the targets as not run (skipped, not passed).
option(LOOM_FUZZ "build the libFuzzer targets (clang only)" OFF)
set(LOOM_FUZZ_SECONDS 20 CACHE STRING "seconds each fuzz ctest runs")
if(LOOM_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
    set(_fz -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
    file(GLOB _fuzz_api_src ${CMAKE_SOURCE_DIR}/api/*.c)
    add_executable(fuzz_jobspec ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_jobspec.c ${_fuzz_api_src})
    add_executable(fuzz_safetensors ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_safetensors.c
                                    ${CMAKE_SOURCE_DIR}/worker/safetensors.c)
    target_link_libraries(fuzz_jobspec PRIVATE loom_common PkgConfig::JANSSON PkgConfig::CURL m)
    target_link_libraries(fuzz_safetensors PRIVATE loom_common PkgConfig::JANSSON
                                                   PkgConfig::CRYPTO m)
    set(_fuzz_targets jobspec safetensors)
    # The tokenizer.json loader (data/tok_bpe.c, compiled here with the fuzzer's
    # instrumentation; the rest of loom_tok links as is).
    if(TARGET loom_tok)
        add_executable(fuzz_tok ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_tok.c
                                ${CMAKE_SOURCE_DIR}/data/tok_bpe.c)
        target_link_libraries(fuzz_tok PRIVATE loom_tok)
        list(APPEND _fuzz_targets tok)
    endif()
    # The request path: loomd runs inside fuzz_http, daemon/ instrumented too.
    if(TARGET loom_daemon)
        target_compile_options(loom_daemon PRIVATE -fsanitize=fuzzer-no-link,address,undefined)
        target_link_options(loom_daemon INTERFACE -fsanitize=address,undefined) # loomd, tests
        add_executable(fuzz_http ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_http.c)
        target_link_libraries(fuzz_http PRIVATE loom_daemon)
        list(APPEND _fuzz_targets http)
    endif()
    set(_fuzz_args_http -detect_leaks=0) # loomd's caches outlive an input by design
    foreach(t ${_fuzz_targets})
        target_compile_options(fuzz_${t} PRIVATE ${_fz} -g)
        target_link_options(fuzz_${t} PRIVATE ${_fz})
        target_include_directories(fuzz_${t} PRIVATE ${CMAKE_SOURCE_DIR})
        add_test(NAME fuzz.${t}
                 COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_${t}>
                         ${CMAKE_CURRENT_LIST_DIR}/fuzz/corpus/${t} ${LOOM_FUZZ_SECONDS}
                         ${_fuzz_args_${t}})
        math(EXPR _to "${LOOM_FUZZ_SECONDS} + 60")
        set_tests_properties(fuzz.${t} PROPERTIES LABELS fuzz TIMEOUT ${_to})
    endforeach()
else()
    add_test(NAME fuzz.libfuzzer
             COMMAND sh -c "echo 'fuzz targets not built (needs -DLOOM_FUZZ=ON with clang): NOT run'; exit 77")
    set_tests_properties(fuzz.libfuzzer PROPERTIES LABELS fuzz SKIP_RETURN_CODE 77)
endif()
