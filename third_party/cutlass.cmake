# Locate the CUTLASS headers. Order:
#   1. -DCUTLASS_DIR=<dir> (or the CUTLASS_DIR environment variable): a CUTLASS checkout or the
#      wheel's cutlass_library/source folder; must hold include/cutlass/cutlass.h.
#   2. The pinned nvidia-cutlass wheel installed for the Python that builds us (found with
#      importlib.util.find_spec, without importing the package: its import needs cuda-python).
# Defines the interface target gemmbn::cutlass.
set(GEMMBN_CUTLASS_WHEEL_VERSION "4.2.0.0")

if(NOT CUTLASS_DIR AND DEFINED ENV{CUTLASS_DIR})
  set(CUTLASS_DIR "$ENV{CUTLASS_DIR}")
endif()

if(NOT CUTLASS_DIR)
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u, os; s = u.find_spec('cutlass_library'); print(os.path.join(s.submodule_search_locations[0], 'source') if s else '')"
    OUTPUT_VARIABLE _gemmbn_cutlass_wheel OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_gemmbn_cutlass_wheel)
    set(CUTLASS_DIR "${_gemmbn_cutlass_wheel}")
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c "import importlib.metadata as m; print(m.version('nvidia-cutlass'))"
      OUTPUT_VARIABLE _gemmbn_cutlass_version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _gemmbn_cutlass_version STREQUAL GEMMBN_CUTLASS_WHEEL_VERSION)
      message(WARNING "gemmbn is pinned to nvidia-cutlass==${GEMMBN_CUTLASS_WHEEL_VERSION}; found '${_gemmbn_cutlass_version}'")
    endif()
  endif()
endif()

if(NOT CUTLASS_DIR OR NOT EXISTS "${CUTLASS_DIR}/include/cutlass/cutlass.h")
  message(FATAL_ERROR
    "gemmbn: CUTLASS headers not found (CUTLASS_DIR='${CUTLASS_DIR}').\n"
    "Install the pinned wheel for the building Python:\n"
    "  python -m pip install --no-deps nvidia-cutlass==${GEMMBN_CUTLASS_WHEEL_VERSION}\n"
    "and build without isolation (pip install --no-build-isolation .), or pass -DCUTLASS_DIR=<dir with include/cutlass>.")
endif()
message(STATUS "gemmbn: CUTLASS headers from ${CUTLASS_DIR}")

add_library(gemmbn_cutlass INTERFACE)
add_library(gemmbn::cutlass ALIAS gemmbn_cutlass)
target_include_directories(gemmbn_cutlass SYSTEM INTERFACE "${CUTLASS_DIR}/include")
if(EXISTS "${CUTLASS_DIR}/tools/util/include")
  target_include_directories(gemmbn_cutlass SYSTEM INTERFACE "${CUTLASS_DIR}/tools/util/include")
endif()
