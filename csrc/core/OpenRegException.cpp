#include "core/OpenRegException.h"

#include <string>

namespace openreg {

std::string format_error(orError_t err, const char* expr) {
  std::string msg = "openreg error: ";
  msg += orGetErrorString(err);
  msg += " (";
  msg += orGetErrorName(err);
  msg += " from ";
  msg += expr;
  msg += ")";
  return msg;
}

}  // namespace openreg
