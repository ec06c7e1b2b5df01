# SIMULATOR ONLY: the simulator's engine (core/OpenRegEngine.h), included by
# csrc/CMakeLists.txt when this folder exists. A port deletes the folder; the
# integration then builds alone, with the defaults of a device whose memory
# the host cannot map.
target_sources(openreg_C PRIVATE
  engine/OpenRegEngineHooks.cpp
  engine/OpenRegKernelView.cpp
  engine/OpenRegViewCopy.cpp
  engine/fallback/OpenRegCallEncoder.cpp
  engine/fallback/OpenRegCapture.cpp
  engine/fallback/OpenRegDescribedAnswer.cpp
  engine/fallback/OpenRegDescribedCall.cpp
  engine/fallback/OpenRegDeviceAssert.cpp
  engine/fallback/OpenRegFallback.cpp
  engine/fallback/OpenRegLaunchPlan.cpp
  engine/fallback/OpenRegLayoutFallback.cpp
  engine/fallback/OpenRegLayouts.cpp
  engine/fallback/OpenRegOutResize.cpp
  engine/fallback/OpenRegQueuedCall.cpp
  engine/fallback/OpenRegReservedResults.cpp
  engine/fallback/OpenRegUnboxedEntry.cpp
  engine/inductor/OpenRegCompiledKernel.cpp
  engine/inductor/OpenRegInductorPython.cpp
  engine/memory/OpenRegKernelScratch.cpp
  engine/ops/OpenRegAttention.cpp
  engine/ops/OpenRegCustomOps.cpp
  engine/ops/OpenRegDirectBinary.cpp
  engine/ops/OpenRegOverrideableOps.cpp
  engine/ops/OpenRegRandomOps.cpp)

# The engine's device code: ATen's CPU kernels run from serialized calls,
# openreg's fused dropout, the example custom operator.
target_sources(openreg_device_code PRIVATE
  engine/kernels/OpenRegBinaryKernels.cpp
  engine/kernels/OpenRegBoxedCall.cpp
  engine/kernels/OpenRegCallAnswer.cpp
  engine/kernels/OpenRegCpuMath.cpp
  engine/kernels/OpenRegCustomOpKernels.cpp
  engine/kernels/OpenRegDropout.cpp
  engine/kernels/OpenRegParallel.cpp
  engine/kernels/OpenRegReservedBlocks.cpp)
# openreg's own kernels split their loops with OpenMP (engine/kernels/OpenRegParallel.cpp):
# that one file is compiled with -fopenmp; nothing is linked with it, so its
# regions run on the libgomp above.
set_source_files_properties(engine/kernels/OpenRegParallel.cpp PROPERTIES
  COMPILE_OPTIONS -fopenmp)

# Its entry points in the kernel library, and their workspace, which becomes
# the device process's CPU allocator (engine/kernels/OpenRegWorkspace.h): the
# library must never be unmapped.
target_sources(openreg_kernels PRIVATE
  engine/kernels/OpenRegEngineKernels.cpp
  engine/kernels/OpenRegWorkspace.cpp)
target_link_options(openreg_kernels PRIVATE "LINKER:-z,nodelete")

# Serialized boxed calls through the kernel library, against the CPU, with
# each driver (csrc/engine/tests/boxed_call_test.cpp). Needs ATen and the runtime,
# not the extension.
if(OPENREG_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
  add_executable(openreg_boxed_call_tests engine/tests/boxed_call_test.cpp
    $<TARGET_OBJECTS:openreg_device_code>)
  target_include_directories(openreg_boxed_call_tests PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(openreg_boxed_call_tests PRIVATE
    OPENREG_KERNELS_DEFAULT="$<TARGET_FILE:openreg_kernels>")
  target_link_libraries(openreg_boxed_call_tests PRIVATE openreg_runtime
    ${TORCH_LIBRARIES} "${OPENREG_TORCH_OPENMP}" GTest::gtest GTest::gtest_main)
  add_dependencies(openreg_boxed_call_tests openreg_kernels openreg-device)
  gtest_discover_tests(openreg_boxed_call_tests DISCOVERY_MODE PRE_TEST
    TEST_PREFIX "boxed-call-thread." PROPERTIES ENVIRONMENT "OPENREG_DRIVER=thread")
  gtest_discover_tests(openreg_boxed_call_tests DISCOVERY_MODE PRE_TEST
    TEST_PREFIX "boxed-call-process." PROPERTIES ENVIRONMENT
    "OPENREG_DRIVER=process;OPENREG_DEVICE_EXECUTABLE=$<TARGET_FILE:openreg-device>")
endif()
