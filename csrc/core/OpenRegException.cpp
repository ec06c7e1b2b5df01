#include "core/OpenRegException.h"

#include <string>
#include <vector>

#include "core/OpenRegFaults.h"

namespace openreg {

std::string format_error(orError_t err, const char* expr) {
  std::string msg = "openreg error: ";
  msg += orGetErrorString(err);
  msg += " (";
  msg += orGetErrorName(err);
  msg += " from ";
  msg += expr;
  msg += ")";
  if (err == orErrorInitializationError) {
    char why[512] = {};
    if (orGetInitErrorMessage(why, sizeof(why)) == orSuccess && why[0] != 0) {
      msg += ": ";
      msg += why;
    }
  }
  return msg;
}

void throw_device_lost(const char* expr) {
  std::string lost;
  std::vector<int> devices;
  int count = 0;
  if (orGetDeviceCount(&count) == orSuccess) {
    for (int d = 0; d < count; ++d) {
      char reason[256];
      if (orDeviceGetLossReason(d, reason, sizeof(reason)) ==
          orErrorDeviceLost) {
        lost += (lost.empty() ? "" : "; ") + std::string("openreg:") +
                std::to_string(d) + " (" + reason + ")";
        devices.push_back(d);
      }
    }
  }
  const std::string msg =
      "openreg device lost: " + (lost.empty() ? "a device" : lost) +
      ". Its queued work was dropped and every call that uses it fails; "
      "other devices keep working. (" +
      format_error(orErrorDeviceLost, expr) + ")";
  for (int d : devices) {
    faults::poison(d, msg);
  }
  throw c10::AcceleratorError({__func__, __FILE__, __LINE__}, orErrorDeviceLost,
                              msg);
}

}  // namespace openreg
