// Turning runtime error codes into c10 errors at the caller's location.
#pragma once

#include <c10/util/Exception.h>
#include <openreg.h>

namespace openreg {

// Builds the message for a failed runtime call (used by the macros below).
std::string format_error(orError_t err, const char* expr);

// Throws torch.AcceleratorError for orErrorDeviceLost, naming every lost
// device and why it was lost (orDeviceGetLossReason). Every later call on
// those devices raises the same error at once (faults::check_not_poisoned),
// including those the caching allocator serves without the driver.
[[noreturn]] void throw_device_lost(const char* expr);

}  // namespace openreg

// Checks a runtime call; throws a c10::Error naming the call and the error.
// An out-of-memory code becomes torch.OutOfMemoryError.
#define OPENREG_CHECK(EXPR)                                             \
  do {                                                                  \
    const orError_t openreg_err_ = (EXPR);                              \
    if (C10_UNLIKELY(openreg_err_ != orSuccess)) {                      \
      if (openreg_err_ == orErrorDeviceLost) {                          \
        ::openreg::throw_device_lost(#EXPR);                            \
      }                                                                 \
      TORCH_CHECK_WITH(OutOfMemoryError,                                \
                       openreg_err_ != orErrorMemoryAllocation,         \
                       ::openreg::format_error(openreg_err_, #EXPR));   \
      TORCH_CHECK(false, ::openreg::format_error(openreg_err_, #EXPR)); \
    }                                                                   \
  } while (0)

// For destructors and noexcept code: warns instead of throwing. A forked
// child may not touch the runtime; objects inherited from the parent are
// released silently there.
#define OPENREG_CHECK_WARN(EXPR)                                    \
  do {                                                              \
    const orError_t openreg_err_ = (EXPR);                          \
    if (C10_UNLIKELY(openreg_err_ != orSuccess &&                   \
                     openreg_err_ != orErrorInitializedInParent)) { \
      TORCH_WARN(::openreg::format_error(openreg_err_, #EXPR));     \
    }                                                               \
  } while (0)
