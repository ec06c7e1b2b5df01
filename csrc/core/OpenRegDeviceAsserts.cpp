#include "core/OpenRegDeviceAsserts.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "kernels/OpenRegDeviceAssertOps.h"

namespace openreg {

bool cuda_device_asserts() {
  static const bool cuda = [] {
    const char* env = std::getenv("OPENREG_DEVICE_ASSERTS");
    if (env == nullptr || env[0] == '\0' || std::strcmp(env, "cuda") == 0) {
      return true;
    }
    TORCH_CHECK(std::strcmp(env, "cpu") == 0, "OPENREG_DEVICE_ASSERTS='", env,
                "' is not 'cuda' (a bad value a kernel sees is a device-side "
                "assert, as on CUDA: the default) or 'cpu' (the CPU "
                "kernel's error, the device stays usable)");
    return false;
  }();
  return cuda;
}

// [doc:device-assert-message]
std::string device_assert_message(c10::DeviceIndex device,
                                  const std::string& op,
                                  const std::string& what) {
  std::string msg = "openreg error: device-side assert triggered on openreg:" +
                    std::to_string(device) + " in " + op + ": " + what;
  if (!launch_blocking()) {
    msg +=
        "\nopenreg kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect.\nFor "
        "debugging consider passing OPENREG_LAUNCH_BLOCKING=1 (on CUDA: "
        "CUDA_LAUNCH_BLOCKING=1).";
  }
  msg +=
      "\nThe device is unusable for the rest of the process, as a CUDA "
      "context after a device-side assert (OPENREG_DEVICE_ASSERTS=cpu "
      "raises the CPU kernel's error at the call instead).";
  return msg;
}
// [/doc:device-assert-message]

void trigger_device_assert(c10::DeviceIndex device, const std::string& op,
                           const std::string& what) {
  faults::poison(device, device_assert_message(device, op, what));
}

std::string device_assert_of_failure(c10::DeviceIndex device,
                                     const std::string& message) {
  static constexpr char kPrefix[] = "openreg kernel '";
  static constexpr char kMiddle[] = "' failed on the device: ";
  if (!cuda_device_asserts() || message.rfind(kPrefix, 0) != 0) {
    return message;
  }
  const size_t end = message.find(kMiddle);
  if (end == std::string::npos) {
    return message;
  }
  const std::string op =
      message.substr(sizeof(kPrefix) - 1, end - (sizeof(kPrefix) - 1));
  const std::string what = message.substr(end + sizeof(kMiddle) - 1);
  // An injected failure is a launch failure, not an assert.
  if (!asserts_on_device(op) ||
      what.find("torch.openreg.faults") != std::string::npos) {
    return message;
  }
  trigger_device_assert(device, op, what);
  return device_assert_message(device, op, what);
}

}  // namespace openreg
