// Status and Result<T>: errors as values (leveldb style). Anything a user can cause returns a
// Status whose message names the file, key and value; only cli/ turns one into an exit code.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace ptdp {

// A success, or a one-line error message.
class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  // The one-line message; empty when ok().
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "<prefix>: <message>" (for adding file or context).
  Status Prefixed(const std::string& prefix) const {
    return ok() ? *this : Status(prefix + ": " + message_);
  }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

// A value of type T, or the Status that explains why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}               // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {         // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result from an OK Status has no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // Precondition for value(): ok().
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  // The error; an OK Status when ok().
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ptdp

// Returns early from a function returning Status or Result<...> when `expr` failed.
#define PTDP_RETURN_IF_ERROR(expr)            \
  do {                                        \
    ::ptdp::Status _st = (expr);              \
    if (!_st.ok()) return _st;                \
  } while (0)

#define PTDP_CONCAT_INNER(a, b) a##b
#define PTDP_CONCAT(a, b) PTDP_CONCAT_INNER(a, b)
// PTDP_ASSIGN_OR_RETURN(auto x, Foo()); assigns the value or returns the error.
#define PTDP_ASSIGN_OR_RETURN(lhs, expr) \
  PTDP_ASSIGN_OR_RETURN_IMPL(PTDP_CONCAT(_res_, __LINE__), lhs, expr)
#define PTDP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
