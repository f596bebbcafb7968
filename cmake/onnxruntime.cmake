# Imports the ONNX Runtime shared library that scripts/setup.sh extracted from the pinned npm
# package. Headers and library come from the same release, so the API version always matches.
if(NOT ONNXRUNTIME_ROOT)
  set(ONNXRUNTIME_ROOT "$ENV{HOME}/.cache/inferd/onnxruntime-1.29.0")
endif()
find_path(ONNXRUNTIME_INCLUDE_DIR onnxruntime_cxx_api.h PATHS "${ONNXRUNTIME_ROOT}/include" NO_DEFAULT_PATH)
find_library(ONNXRUNTIME_LIBRARY NAMES onnxruntime PATHS "${ONNXRUNTIME_ROOT}/lib" NO_DEFAULT_PATH)
if(NOT ONNXRUNTIME_INCLUDE_DIR OR NOT ONNXRUNTIME_LIBRARY)
  message(FATAL_ERROR "ONNX Runtime not found under '${ONNXRUNTIME_ROOT}'; run scripts/setup.sh")
endif()
add_library(onnxruntime::onnxruntime SHARED IMPORTED GLOBAL)
set_target_properties(onnxruntime::onnxruntime PROPERTIES
  IMPORTED_LOCATION "${ONNXRUNTIME_LIBRARY}"
  IMPORTED_SONAME "libonnxruntime.so.1"
  INTERFACE_INCLUDE_DIRECTORIES "${ONNXRUNTIME_INCLUDE_DIR}")
get_filename_component(ONNXRUNTIME_LIB_DIR "${ONNXRUNTIME_LIBRARY}" DIRECTORY)
set(CMAKE_BUILD_RPATH "${CMAKE_BUILD_RPATH};${ONNXRUNTIME_LIB_DIR}")
