// The body of a queued kernel: a move-only `void()` callable.
//
// A launch hands its closure to the stream, which runs it later on the
// worker; the host destroys it once it has run (OpenRegLaunch.cpp,
// "task-reclaim"). std::function would do, but it must be copyable (so a
// closure cannot own a pooled object) and it keeps only 16 bytes inline, so
// nearly every launch would allocate its closure on the heap. A KernelBody
// keeps closures of up to kInlineBytes inside itself, and takes move-only
// ones. Larger closures go to the heap, as with std::function.
//
// Not thread-safe (a value type): one thread at a time owns it.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace openreg {

class KernelBody {
 public:
  static constexpr size_t kInlineBytes = 64;

  KernelBody() noexcept = default;

  template <typename F, typename = std::enable_if_t<
                            !std::is_same_v<std::decay_t<F>, KernelBody> &&
                            std::is_invocable_r_v<void, std::decay_t<F>&>>>
  // NOLINTNEXTLINE(google-explicit-constructor): lambdas convert implicitly
  KernelBody(F&& f) {
    using Fn = std::decay_t<F>;
    if constexpr (fits_inline<Fn>()) {
      new (&storage_) Fn(std::forward<F>(f));
      ops_ = inline_ops<Fn>();
    } else {
      heap_ = new Fn(std::forward<F>(f));
      ops_ = heap_ops<Fn>();
    }
  }

  KernelBody(KernelBody&& other) noexcept { take(other); }
  KernelBody& operator=(KernelBody&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  KernelBody& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  KernelBody(const KernelBody&) = delete;
  KernelBody& operator=(const KernelBody&) = delete;
  ~KernelBody() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  void operator()() {
    TORCH_INTERNAL_ASSERT(ops_ != nullptr, "calling an empty KernelBody");
    ops_->call(this);
  }

 private:
  struct Ops {
    void (*call)(KernelBody*);
    // Moves the closure of `from` into `to` (empty) and leaves `from` empty.
    void (*move)(KernelBody* to, KernelBody* from) noexcept;
    void (*destroy)(KernelBody*) noexcept;
  };

  template <typename Fn>
  static constexpr bool fits_inline() {
    return sizeof(Fn) <= kInlineBytes &&
           alignof(Fn) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<Fn>;
  }

  template <typename Fn>
  Fn* inline_fn() noexcept {
    return std::launder(reinterpret_cast<Fn*>(&storage_));
  }

  template <typename Fn>
  static void call_inline(KernelBody* self) {
    (*self->inline_fn<Fn>())();
  }
  template <typename Fn>
  static void move_inline(KernelBody* to, KernelBody* from) noexcept {
    Fn* fn = from->inline_fn<Fn>();
    new (&to->storage_) Fn(std::move(*fn));
    fn->~Fn();
  }
  template <typename Fn>
  static void destroy_inline(KernelBody* self) noexcept {
    self->inline_fn<Fn>()->~Fn();
  }
  template <typename Fn>
  static void call_heap(KernelBody* self) {
    (*static_cast<Fn*>(self->heap_))();
  }
  static void move_heap(KernelBody* to, KernelBody* from) noexcept {
    to->heap_ = std::exchange(from->heap_, nullptr);
  }
  template <typename Fn>
  static void destroy_heap(KernelBody* self) noexcept {
    delete static_cast<Fn*>(self->heap_);
  }

  template <typename Fn>
  static const Ops* inline_ops() {
    static constexpr Ops ops{&call_inline<Fn>, &move_inline<Fn>,
                             &destroy_inline<Fn>};
    return &ops;
  }
  template <typename Fn>
  static const Ops* heap_ops() {
    static constexpr Ops ops{&call_heap<Fn>, &move_heap, &destroy_heap<Fn>};
    return &ops;
  }

  void take(KernelBody& other) noexcept {
    if (other.ops_ != nullptr) {
      other.ops_->move(this, &other);
      ops_ = std::exchange(other.ops_, nullptr);
    }
  }

  void reset() noexcept {
    if (ops_ != nullptr) {
      std::exchange(ops_, nullptr)->destroy(this);
    }
  }

  const Ops* ops_ = nullptr;
  union {
    alignas(std::max_align_t) unsigned char storage_[kInlineBytes];
    void* heap_;
  };
};

}  // namespace openreg
