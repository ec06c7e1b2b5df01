// SIMULATOR ONLY: the one-time set-up of the CPU math library under ATen's
// kernels, made when this code is loaded (by the extension in the user's
// process, by libopenreg_kernels.so in each device process), on one thread,
// before any kernel runs on a team.
//
// [doc:cpu-math-setup]
// ATen computes tanh, exp, log, sin and the other functions of at::vml with
// MKL's vector math (VML) in the CPU wheel. The first call of any of them in
// a process picks VML's code path for this CPU and stores it in a global in
// two steps without synchronization (MKL's mkl_vml_serv_cpu_detect), so a
// second thread calling at the same moment can read the value of the first
// step and compute with another path. A device's 2-thread team running a
// process's first tanh hit that window in 1 run in 10 to 20 on two busy
// cores: one thread's half of the tensor came out of AVX2's low-accuracy
// tanh (relative error up to 9e-5, every unsaturated element), the other
// half exact. A CPU process rarely meets it, since its team threads start
// late in its first region; a device process's team is already running.
// One call on one thread, here, settles the choice for the whole process.
// [/doc:cpu-math-setup]
#include <ATen/ATen.h>

namespace openreg {
namespace {

bool set_up_cpu_math() {
  // One element: ATen computes it on this thread (through VML with MKL).
  at::tanh(at::ones({1}, at::kFloat));
  return true;
}

[[maybe_unused]] const bool cpu_math_ready = set_up_cpu_math();

}  // namespace
}  // namespace openreg
