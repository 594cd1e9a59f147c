# `cmake --install`: headers, the component libraries, the tools, a CMake
# package (find_package(Concerto [COMPONENTS core lower schedule runtime driver
# mpi])) and pkg-config files (concerto-core.pc, concerto.pc). Included from
# the top-level CMakeLists.txt after the targets exist.
include(CMakePackageConfigHelpers)

set(CONCERTO_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Concerto)
set(CONCERTO_COMPONENTS core lower schedule runtime driver)
if(TARGET concerto_mpi)
  list(APPEND CONCERTO_COMPONENTS mpi)
endif()

install(DIRECTORY include/concerto DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/include/concerto/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/concerto)

# One export set per component, so that a consumer of Concerto::core loads
# and links nothing of the others (no solver, BLAS or MPI).
foreach(component ${CONCERTO_COMPONENTS})
  set(targets concerto_${component})
  if(component STREQUAL "driver")
    list(APPEND targets concerto)  # Concerto::concerto: everything
  endif()
  install(TARGETS ${targets} EXPORT Concerto-${component}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${component})
  install(EXPORT Concerto-${component} NAMESPACE Concerto:: FILE Concerto-${component}-targets.cmake
          DESTINATION ${CONCERTO_CMAKE_DIR} COMPONENT ${component})
endforeach()
set_target_properties(concerto PROPERTIES EXPORT_NAME concerto)

install(TARGETS concerto_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET concerto_mpi_run)
  install(TARGETS concerto_mpi_run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(cmake/ConcertoConfig.cmake.in ${CMAKE_BINARY_DIR}/ConcertoConfig.cmake
                              INSTALL_DESTINATION ${CONCERTO_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ConcertoConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ConcertoConfig.cmake ${CMAKE_BINARY_DIR}/ConcertoConfigVersion.cmake
        DESTINATION ${CONCERTO_CMAKE_DIR})

# pkg-config: concerto-core (the IR, cost model and simulator) and concerto
# (everything; the solvers and BLAS as private libraries of the static archives).
set(CONCERTO_PC_GECODE_LIBS "")
foreach(lib ${GECODE_LIBRARIES})
  string(APPEND CONCERTO_PC_GECODE_LIBS " ${lib}")
endforeach()
set(CONCERTO_PC_CBC "")
if(CONCERTO_WITH_CBC)
  set(CONCERTO_PC_CBC "cbc")
endif()
# Relocatable: the prefix is found from the .pc file's own place.
file(RELATIVE_PATH CONCERTO_PC_UP /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
set(CONCERTO_PC_PREFIX "\${pcfiledir}/${CONCERTO_PC_UP}")
string(REGEX REPLACE "/$" "" CONCERTO_PC_PREFIX "${CONCERTO_PC_PREFIX}")
configure_file(cmake/concerto-core.pc.in ${CMAKE_BINARY_DIR}/concerto-core.pc @ONLY)
configure_file(cmake/concerto.pc.in ${CMAKE_BINARY_DIR}/concerto.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/concerto-core.pc ${CMAKE_BINARY_DIR}/concerto.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
