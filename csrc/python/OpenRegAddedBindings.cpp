#include "python/OpenRegAddedBindings.h"

#include <vector>

namespace openreg {

namespace {

std::vector<BindingsInit>& added() {
  static std::vector<BindingsInit> inits;
  return inits;
}

}  // namespace

bool add_bindings(BindingsInit init) {
  added().push_back(init);
  return true;
}

void init_added_bindings(pybind11::module_& m) {
  for (BindingsInit init : added()) {
    init(m);
  }
}

}  // namespace openreg
