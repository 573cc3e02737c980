// TS_CHECK(cond, parts...): TORCH_CHECK without iostreams.
//
// TORCH_CHECK formats a message of several parts with std::ostringstream
// (c10::str). A toolchain that links libstdc++ into the extension statically
// (seen with a GCC 13 build whose g++ has no shared libstdc++) leaves that
// copy's iostream / locale state uninitialized, so the first failed check with
// a formatted message crashed the process (SIGSEGV) instead of raising.
// TS_CHECK builds the message with std::string appends and std::to_string (no
// locale), then hands a ready string to c10's check-failure function: the same
// c10::Error (RuntimeError in Python), whatever the toolchain. Supported parts:
// strings, integers, floating point, bool, ScalarType, Device, IntArrayRef;
// anything else is a compile error (add an overload here).
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace tokenspeed_kernel::check {

inline void put(std::string& m, const char* s) { m += s; }
inline void put(std::string& m, const std::string& s) { m += s; }
inline void put(std::string& m, std::string_view s) { m.append(s.data(), s.size()); }
inline void put(std::string& m, bool b) { m += b ? "true" : "false"; }
template <typename I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool> &&
                                           !std::is_same_v<I, char>,
                                       int> = 0>
inline void put(std::string& m, I v) {
  m += std::to_string(v);
}
template <typename F, std::enable_if_t<std::is_floating_point_v<F>, int> = 0>
inline void put(std::string& m, F v) {
  m += std::to_string(v);
}
inline void put(std::string& m, c10::ScalarType t) { m += c10::toString(t); }
inline void put(std::string& m, const c10::Device& d) { m += d.str(); }  // formatted in libc10
inline void put(std::string& m, c10::IntArrayRef a) {
  m += '[';
  for (size_t i = 0; i < a.size(); ++i) {
    if (i) m += ", ";
    m += std::to_string(a[i]);
  }
  m += ']';
}

template <typename... A>
[[noreturn]] C10_NOINLINE void fail(const char* func, const char* file, uint32_t line,
                                    const A&... parts) {
  std::string m;
  (put(m, parts), ...);
  ::c10::detail::torchCheckFail(func, file, line, m);
}

}  // namespace tokenspeed_kernel::check

#define TS_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (C10_UNLIKELY(!(cond)))                                                              \
      ::tokenspeed_kernel::check::fail(__func__, __FILE__, static_cast<uint32_t>(__LINE__), \
                                       __VA_ARGS__);                                        \
  } while (0)
