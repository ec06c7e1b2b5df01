# cmake -DLIBRARY=<module .so> -DCLASS=<ns::Class> -DYAML=<yaml> -P check_kernels.cmake
#
# Fails when LIBRARY leaves a member of CLASS undefined: a kernel that the
# YAML lists (so torchgen declared and registered it) but no source defines.
# A shared object may link with undefined symbols, and a Python module does
# (its Python symbols come from the interpreter), so the linker accepts it;
# the import would then fail with a mangled "undefined symbol".
find_program(NM nm REQUIRED)
execute_process(
  COMMAND "${NM}" --demangle --undefined-only "${LIBRARY}"
  OUTPUT_VARIABLE undefined
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" lines "${undefined}")
set(missing "")
foreach(line IN LISTS lines)
  string(FIND "${line}" "${CLASS}::" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${line}" ${at} -1 symbol)
    string(APPEND missing "\n  ${symbol}")
  endif()
endforeach()
if(NOT missing STREQUAL "")
  message(FATAL_ERROR
    "kernels listed in ${YAML} but not defined (declared by torchgen in "
    "PrivateUse1NativeFunctions.h; define them in csrc/aten/ or remove their "
    "lines):${missing}")
endif()
