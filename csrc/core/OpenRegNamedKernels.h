// The device's kernel library as the host sees it: libopenreg_kernels.so
// (csrc/kernels/) loaded once with orModuleLoad, and its kernels looked up
// by name, as a CUDA program loads a module and gets its functions.
//
// The thread driver dlopens the library in this process; the process driver
// loads it in every device process. Either way the host only ever holds the
// handles and launches with byte parameters (aten/OpenRegLaunch.h,
// launch_function).
#pragma once

#include <openreg.h>

#include <string>

namespace openreg {

// The kernel library's kernels the PyTorch layer launches by name.
enum class NamedKernel {
  kBoxedCall,  // openreg_boxed_call: a serialized boxed ATen call
  kCrash,      // openreg_fault_crash: crashes the device (faults)
  kFail,       // openreg_fault_fail: fails with its bytes as the message
  kDelay,      // openreg_fault_delay: sleeps int64 microseconds
  kStamp,      // openreg_profiler_stamp: stores the clock at a pinned address
  kDropout,    // openreg_dropout: kernels::DropoutParams
  kDropoutBackward,  // openreg_dropout_backward: DropoutBackwardParams
  kCompiledKernel,   // openreg_compiled_kernel: a torch.compile kernel
  kScaledAbs,        // openreg_scaled_abs: kernels::ScaledAbsParams
  kWarn,  // openreg_fault_warn: gives its bytes as a device warning (faults)
  kReleaseWorkspace,  // openreg_release_workspace: frees the cached blocks
  kDescribeCall,      // openreg_describe_call: runs a call, answers its results
  kTakeResults,       // openreg_take_results: a described call's new memory
  kBinary,            // openreg_binary: kernels::BinaryParams
};

// The function of `kernel`, loading the library on first use. Throws with
// the library's path when it cannot be loaded.
orFunction_t named_kernel(NamedKernel kernel);

// Where the kernel library is: $OPENREG_KERNELS_LIBRARY, else beside the
// extension module (setup.py copies it there).
std::string kernel_library_path();

}  // namespace openreg
