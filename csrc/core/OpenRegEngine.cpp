#include "core/OpenRegEngine.h"

namespace openreg {

Engine& engine() {
  static Engine hooks;
  return hooks;
}

}  // namespace openreg
