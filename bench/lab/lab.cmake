# flashgrad-lab, included from bench/CMakeLists.txt (paths relative to bench/).
add_executable(flashgrad_lab lab/main.cpp lab/ab.cpp lab/roofline.cpp lab/small_gemm.cpp lab/bandwidth.cpp
  lab/sweep.cpp lab/sweep_extras.cpp lab/sweep_report.cpp)
set_target_properties(flashgrad_lab PROPERTIES OUTPUT_NAME flashgrad-lab)
target_link_libraries(flashgrad_lab PRIVATE flashgrad_naive flashgrad_tile_ops ${CMAKE_DL_LIBS})
target_include_directories(flashgrad_lab PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/lab)
target_compile_options(flashgrad_lab PRIVATE -Wall -Wextra)
target_compile_definitions(flashgrad_lab PRIVATE FLASHGRAD_LAB_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}/lab")

# The sweep's bf16 GEMM rate comes from oneDNN (Debian: libdnnl-dev); without
# it the rate is reported as n/a.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY dnnl)
if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY)
  target_include_directories(flashgrad_lab PRIVATE ${DNNL_INCLUDE_DIR})
  target_link_libraries(flashgrad_lab PRIVATE ${DNNL_LIBRARY})
  target_compile_definitions(flashgrad_lab PRIVATE FLASHGRAD_HAVE_DNNL=1)
else()
  message(STATUS "flashgrad: oneDNN not found (Debian: apt-get install libdnnl-dev); the sweep reports no bf16 GEMM rate")
endif()
# roofline times the kernels' tile products through BLIS (Debian: libblis-dev)
# and libxsmm (libxsmm-dev) too; without them those columns read n/a. BLIS
# also defines the BLAS and CBLAS symbols, so it is not linked but opened at
# run time on its own (small_gemm.cpp).
find_path(BLIS_INCLUDE_DIR blis.h PATH_SUFFIXES blis)
find_library(BLIS_LIBRARY blis)
if(BLIS_INCLUDE_DIR AND BLIS_LIBRARY)
  set_property(SOURCE lab/small_gemm.cpp APPEND PROPERTY INCLUDE_DIRECTORIES ${BLIS_INCLUDE_DIR})
  set_property(SOURCE lab/small_gemm.cpp APPEND PROPERTY COMPILE_DEFINITIONS FLASHGRAD_HAVE_BLIS=1)
else()
  message(STATUS "flashgrad: BLIS not found (Debian: apt-get install libblis-dev); roofline reports it as n/a")
endif()
find_path(LIBXSMM_INCLUDE_DIR libxsmm.h)
find_library(LIBXSMM_LIBRARY xsmm)
if(LIBXSMM_INCLUDE_DIR AND LIBXSMM_LIBRARY)
  set_property(SOURCE lab/small_gemm.cpp APPEND PROPERTY INCLUDE_DIRECTORIES ${LIBXSMM_INCLUDE_DIR})
  set_property(SOURCE lab/small_gemm.cpp APPEND PROPERTY COMPILE_DEFINITIONS FLASHGRAD_HAVE_LIBXSMM=1)
  # libxsmm falls back on the BLAS (OpenBLAS here) for shapes it does not JIT.
  target_link_libraries(flashgrad_lab PRIVATE ${LIBXSMM_LIBRARY} rt)
else()
  message(STATUS "flashgrad: libxsmm not found (Debian: apt-get install libxsmm-dev); roofline reports it as n/a")
endif()

# The sweep runs these scripts; keep copies beside the binary.
foreach(script plot_sweep.py torch_attention.py)
  configure_file(lab/${script} ${CMAKE_CURRENT_BINARY_DIR}/${script} COPYONLY)
endforeach()

if(FLASHGRAD_BUILD_TESTS)
  enable_testing()
  # A build against itself (B from a temporary copy): both checked, both
  # timed, and their outputs bit for bit the same.
  add_test(NAME lab_ab_self COMMAND flashgrad_lab ab --lib-a $<TARGET_FILE:flashgrad> --lib-b $<TARGET_FILE:flashgrad>
                                    --seqlen-q 300 --seqlen-k 200 --heads-q 4 --heads-kv 2 --head-dim 40
                                    --head-dim-v 24 --causal --layout bhsd --pass forward+backward --pairs 3
                                    --expect-identical)
  set_tests_properties(lab_ab_self PROPERTIES PASS_REGULAR_EXPRESSION
                       "B's speed over A's, per pair.*outputs: bitwise identical")
  add_test(NAME lab_ab_bad_lib COMMAND flashgrad_lab ab --lib-a /nonexistent/libflashgrad.so
                                       --lib-b $<TARGET_FILE:flashgrad>)
  set_tests_properties(lab_ab_bad_lib PROPERTIES PASS_REGULAR_EXPRESSION
                       "flag --lib-a: expected a flashgrad shared library, got '/nonexistent/libflashgrad.so'")
  # --paired-sgemm is measure's flag here, and needs --split.
  add_test(NAME lab_measure_paired COMMAND flashgrad_lab measure --impl flashgrad --seqlen 128 --min-time 0
                                           --split --paired-sgemm 256)
  set_tests_properties(lab_measure_paired PROPERTIES PASS_REGULAR_EXPRESSION
                       "ms=[0-9.]+ fwd_ms=.* sgemm_paired=[0-9.]+ fwd_over_sgemm=[0-9.]+ bwd_over_sgemm=[0-9.]+")
  add_test(NAME lab_measure_paired_no_split COMMAND flashgrad_lab measure --impl flashgrad --seqlen 128
                                                    --paired-sgemm 256)
  set_tests_properties(lab_measure_paired_no_split PROPERTIES PASS_REGULAR_EXPRESSION
                       "flashgrad-lab measure: flag --paired-sgemm: expected --split beside it, got '256'")
  set_tests_properties(lab_ab_self lab_ab_bad_lib lab_measure_paired lab_measure_paired_no_split
                       PROPERTIES LABELS lab)

  # The benchmark suite's small subset must run end to end and write its reports.
  set(sweep_out ${CMAKE_CURRENT_BINARY_DIR}/sweep_test)
  add_test(NAME bench_sweep_quick COMMAND sh -c
           "rm -rf '${sweep_out}' && '$<TARGET_FILE:flashgrad_lab>' sweep --quick --out '${sweep_out}' && \
            test -s '${sweep_out}/sweep.md' && test -s '${sweep_out}/sweep.json' && \
            { ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || \
              { test -s '${sweep_out}/sweep_time.png' && test -s '${sweep_out}/sweep_memory.png' && \
                test -s '${sweep_out}/sweep_ratio.png'; }; }")
  set_tests_properties(bench_sweep_quick PROPERTIES LABELS bench TIMEOUT 120 RUN_SERIAL TRUE)
endif()
