# `cmake --install <build> [--prefix P]` for C and C++ users: the public
# headers, libflashgrad (and libflashgrad_mpi when MPI was found), a CMake
# package (find_package(flashgrad) -> flashgrad::flashgrad, flashgrad::mpi)
# and a pkg-config file (flashgrad.pc; flashgrad-mpi.pc with MPI).
# tests/install/ builds a consumer project against the installed tree.
include(CMakePackageConfigHelpers)

set(FLASHGRAD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashgrad)

install(FILES include/flashgrad/flashgrad.h include/flashgrad/flashgrad.hpp include/flashgrad/shard.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashgrad COMPONENT dev)
install(TARGETS flashgrad EXPORT flashgrad-targets COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
set(FLASHGRAD_INSTALL_MPI OFF)
if(TARGET flashgrad_mpi)
  set(FLASHGRAD_INSTALL_MPI ON)
  install(FILES include/flashgrad/ring.h include/flashgrad/ring.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashgrad COMPONENT dev)
  install(TARGETS flashgrad_mpi EXPORT flashgrad-targets COMPONENT dev
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT flashgrad-targets NAMESPACE flashgrad:: DESTINATION ${FLASHGRAD_CMAKE_DIR} COMPONENT dev)

configure_package_config_file(cmake/flashgrad-config.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flashgrad-config.cmake INSTALL_DESTINATION ${FLASHGRAD_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashgrad-config-version.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashgrad-config.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flashgrad-config-version.cmake
        DESTINATION ${FLASHGRAD_CMAKE_DIR} COMPONENT dev)

# pkg-config: paths relative to the .pc file's own folder, so the tree can move.
file(RELATIVE_PATH FLASHGRAD_PC_UP /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
set(FLASHGRAD_PC_DLPACK "")
if(NOT DLPACK_INCLUDE_DIR STREQUAL "/usr/include")
  set(FLASHGRAD_PC_DLPACK " -I${DLPACK_INCLUDE_DIR}")
endif()
configure_file(cmake/flashgrad.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashgrad.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashgrad.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
if(FLASHGRAD_INSTALL_MPI)
  configure_file(cmake/flashgrad-mpi.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashgrad-mpi.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashgrad-mpi.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endif()
