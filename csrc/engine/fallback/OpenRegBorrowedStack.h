// A boxed call's stack whose tensor arguments are borrowed from the
// caller's references instead of copied into it.
//
// Why: a tensor that only Python refers to has a reference count of 1, and
// when a C++ reference joins it (1 -> 2) PyTorch keeps its Python object
// alive by taking the GIL and increfing it (TensorImpl::incref_pyobject),
// and gives it back at 2 -> 1. The dispatcher's boxing of an unboxed call
// (BoxedKernelWrapper) copies every tensor argument into the stack, so
// `x + 1` on openreg took the GIL twice, which the Python binding had
// released: about a tenth of the host's time per operator. A borrowed entry
// holds the caller's pointer without a count; it is never destroyed as a
// reference, only forgotten.
//
// Rules for whoever receives the stack: read the arguments, copy them (a
// copy is a real reference), but neither pop, assign nor move a borrowed
// entry: call own() first, which turns every entry into a real reference,
// or drop_front(). The unboxed entries (OpenRegUnboxedEntry.cpp) build
// it; the fallback (OpenRegFallback.cpp) keeps it borrowed on the queued
// path and owns it before any other.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

#include <utility>
#include <vector>

namespace openreg {

class BorrowedStack {
 public:
  // The vector comes from the thread's spares, and goes back to them: a
  // warm call allocates none.
  BorrowedStack() {
    Spares& spares = thread_spares();
    if (!spares.empty()) {
      stack_ = std::move(spares.back());
      spares.pop_back();
    }
  }
  BorrowedStack(const BorrowedStack&) = delete;
  BorrowedStack& operator=(const BorrowedStack&) = delete;
  ~BorrowedStack() {
    forget_borrowed();
    stack_.clear();
    Spares& spares = thread_spares();
    // Room reserved when the spares were made: giving back never allocates.
    if (spares.size() < spares.capacity() && stack_.capacity() <= kMaxSpare) {
      spares.push_back(std::move(stack_));
    }
  }

  // A tensor argument: borrowed. Undefined tensors hold no reference.
  void push(const at::Tensor& t) {
    stack_.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
    borrowed_.push_back(true);
  }
  void push(at::Tensor& t) { push(static_cast<const at::Tensor&>(t)); }
  // A borrowed copy of a borrowed entry (an in-place result is the
  // argument it aliases), to give back with push_result(v, true).
  c10::IValue borrow(size_t index) const {
    TORCH_INTERNAL_ASSERT(index < stack_.size() && borrowed_[index]);
    return c10::MaybeOwnedTraits<c10::IValue>::createBorrow(stack_[index]);
  }
  // Room for `n` entries, so that push_result() does not allocate.
  void reserve(size_t n) {
    stack_.reserve(n);
    borrowed_.reserve(n);
  }
  void push_result(c10::IValue v, bool is_borrow) {
    TORCH_INTERNAL_ASSERT(stack_.size() < stack_.capacity() || !is_borrow);
    stack_.push_back(std::move(v));
    borrowed_.push_back(is_borrow);
  }
  // Any other argument (a Scalar, an int, a dtype, a string): owned.
  template <class T>
  void push(T&& v) {
    torch::jit::push_one(stack_, std::forward<T>(v));
    borrowed_.push_back(false);
  }

  const torch::jit::Stack& stack() const { return stack_; }
  size_t size() const { return stack_.size(); }
  bool is_borrowed(size_t index) const { return borrowed_[index]; }

  // Turns every borrowed entry into a real reference.
  void own() {
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (borrowed_[i]) {
        c10::IValue owned = stack_[i];  // a new reference
        c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(stack_[i]);
        stack_[i] = std::move(owned);
        borrowed_[i] = false;
      }
    }
  }

  // Removes the first `n` entries, forgetting the borrowed ones.
  void drop_front(size_t n) noexcept {
    for (size_t i = 0; i < n && i < stack_.size(); ++i) {
      if (borrowed_[i]) {
        c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(stack_[i]);
      }
    }
    stack_.erase(stack_.begin(), stack_.begin() + static_cast<ptrdiff_t>(n));
    borrowed_.erase(borrowed_.begin(),
                    borrowed_.begin() + static_cast<ptrdiff_t>(n));
  }

  // The single result of a functional call, as an owned tensor.
  at::Tensor take_tensor_result() {
    TORCH_INTERNAL_ASSERT(stack_.size() == 1);
    own();
    at::Tensor t = std::move(stack_.back()).toTensor();
    stack_.clear();
    borrowed_.clear();
    return t;
  }

 private:
  void forget_borrowed() noexcept {
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (borrowed_[i]) {
        c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(stack_[i]);
      }
    }
  }

  // At most this many vectors of at most kMaxSpare entries are kept per
  // thread (a call inside a call takes a second one).
  static constexpr size_t kSpares = 4;
  static constexpr size_t kMaxSpare = 32;
  using Spares = std::vector<torch::jit::Stack>;
  static Spares& thread_spares() {
    thread_local Spares spares = [] {
      Spares s;
      s.reserve(kSpares);
      return s;
    }();
    return spares;
  }

  torch::jit::Stack stack_;
  c10::SmallVector<bool, 8> borrowed_;
};

}  // namespace openreg
