// ft_hls.h -- the small static header the fusion_tvm HLS emitter writes against.
//
// With Vitis HLS (or any tree that provides <ap_fixed.h> and <hls_stream.h>) the vendor
// headers are used.  Elsewhere (g++ C simulation) this file provides work-alikes:
//   * hls::stream<T>           -- an unbounded FIFO (a C simulation runs the dataflow
//                                 processes one after another, so depth never blocks);
//   * ap_fixed<W, I, Q, O>     -- two's-complement fixed point, W total bits, I integer bits
//                                 (sign included), quantisation AP_TRN (floor) or AP_RND
//                                 (round half up), overflow AP_WRAP or AP_SAT;
//   * ft::exp / sqrt / ...     -- math on float or fixed (fixed goes through float here; on
//                                 the device hls_math.h provides table-based versions).
// #pragma HLS lines are ignored by g++ (unknown pragmas; -Wno-unknown-pragmas).
#ifndef FT_HLS_H_
#define FT_HLS_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>

#if defined(FT_USE_VENDOR_HLS) || defined(__SYNTHESIS__)
#include <ap_fixed.h>
#include <hls_math.h>
#include <hls_stream.h>
#define FT_VENDOR 1
#else
#define FT_VENDOR 0

namespace hls {

template <typename T>
class stream {
 public:
  stream() = default;
  explicit stream(const char* /*name*/) {}
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  void write(const T& v) { q_.push_back(v); }
  T read() {
    if (q_.empty()) {
      std::fprintf(stderr, "ft_hls: read from an empty hls::stream (dataflow deadlock)\n");
      std::abort();
    }
    T v = q_.front();
    q_.pop_front();
    return v;
  }
  void read(T& v) { v = read(); }
  void operator<<(const T& v) { write(v); }
  void operator>>(T& v) { v = read(); }
  bool empty() const { return q_.empty(); }
  bool full() const { return false; }
  std::size_t size() const { return q_.size(); }

 private:
  std::deque<T> q_;
};

}  // namespace hls

enum ap_q_mode { AP_TRN = 0, AP_RND = 1 };
enum ap_o_mode { AP_WRAP = 0, AP_SAT = 1 };

// Fixed point with W <= 32 total bits, I integer bits (may exceed W or be negative).
template <int W, int I, ap_q_mode Q = AP_TRN, ap_o_mode O = AP_WRAP>
struct ap_fixed {
  static_assert(W >= 2 && W <= 32, "ft_hls ap_fixed supports 2..32 bits");
  static constexpr int F = W - I;  // fractional bits
  int64_t raw = 0;                 // always kept in range [-2^(W-1), 2^(W-1))

  ap_fixed() = default;
  ap_fixed(double v) { raw = fit(quantize(v)); }  // NOLINT: implicit like ap_fixed
  ap_fixed(float v) : ap_fixed(static_cast<double>(v)) {}
  ap_fixed(int v) : ap_fixed(static_cast<double>(v)) {}
  ap_fixed(long v) : ap_fixed(static_cast<double>(v)) {}
  ap_fixed(long long v) : ap_fixed(static_cast<double>(v)) {}
  ap_fixed(bool v) : ap_fixed(static_cast<double>(v)) {}

  // Between fixed-point types: re-align the binary point, then quantise / overflow here.
  template <int W2, int I2, ap_q_mode Q2, ap_o_mode O2>
  ap_fixed(const ap_fixed<W2, I2, Q2, O2>& o) {  // NOLINT: implicit like ap_fixed
    constexpr int F2 = W2 - I2;
    int64_t r = o.raw;
    if (F2 > F) {
      const int sh = F2 - F;
      r = (Q == AP_RND) ? ((r + (int64_t(1) << (sh - 1))) >> sh) : (r >> sh);
    } else if (F2 < F) {
      r = r * (int64_t(1) << (F - F2));
    }
    raw = fit(r);
  }

  static ap_fixed from_raw(int64_t r) {
    ap_fixed x;
    x.raw = fit(r);
    return x;
  }
  static int64_t fit(int64_t r) {
    const int64_t lo = -(int64_t(1) << (W - 1));
    const int64_t hi = (int64_t(1) << (W - 1)) - 1;
    if (O == AP_SAT) return r < lo ? lo : (r > hi ? hi : r);
    const uint64_t mask = (uint64_t(1) << W) - 1;
    uint64_t u = static_cast<uint64_t>(r) & mask;
    if (u >> (W - 1)) u |= ~mask;  // sign-extend
    return static_cast<int64_t>(u);
  }
  static int64_t quantize(double v) {
    const double s = std::ldexp(v, F);
    const double q = (Q == AP_RND) ? std::floor(s + 0.5) : std::floor(s);
    if (q > 9.0e18) return INT64_MAX / 2;
    if (q < -9.0e18) return INT64_MIN / 2;
    return static_cast<int64_t>(q);
  }
  // Shift a product with 2F fractional bits back to F, with this type's quantisation.
  static int64_t rescale(int64_t p) {
    if (F <= 0) return p * (int64_t(1) << -F);
    const int64_t half = (Q == AP_RND) ? (int64_t(1) << (F - 1)) : 0;
    return (p + half) >> F;  // arithmetic shift: floor
  }

  double to_double() const { return std::ldexp(static_cast<double>(raw), -F); }
  operator double() const { return to_double(); }  // NOLINT
  float to_float() const { return static_cast<float>(to_double()); }

  ap_fixed operator-() const { return from_raw(-raw); }
  ap_fixed operator+() const { return *this; }
  friend ap_fixed operator+(ap_fixed a, ap_fixed b) { return from_raw(a.raw + b.raw); }
  friend ap_fixed operator-(ap_fixed a, ap_fixed b) { return from_raw(a.raw - b.raw); }
  friend ap_fixed operator*(ap_fixed a, ap_fixed b) { return from_raw(rescale(a.raw * b.raw)); }
  friend ap_fixed operator/(ap_fixed a, ap_fixed b) {
    if (b.raw == 0) return from_raw(a.raw >= 0 ? INT64_MAX / 4 : INT64_MIN / 4);
    const int64_t n = a.raw * (int64_t(1) << (F > 0 ? F : 0));
    double q = static_cast<double>(n) / static_cast<double>(b.raw);
    q = (Q == AP_RND) ? std::floor(q + 0.5) : std::floor(q);
    return from_raw(static_cast<int64_t>(q));
  }
  ap_fixed& operator+=(ap_fixed b) { return *this = *this + b; }
  ap_fixed& operator-=(ap_fixed b) { return *this = *this - b; }
  ap_fixed& operator*=(ap_fixed b) { return *this = *this * b; }
  ap_fixed& operator/=(ap_fixed b) { return *this = *this / b; }
  friend bool operator<(ap_fixed a, ap_fixed b) { return a.raw < b.raw; }
  friend bool operator<=(ap_fixed a, ap_fixed b) { return a.raw <= b.raw; }
  friend bool operator>(ap_fixed a, ap_fixed b) { return a.raw > b.raw; }
  friend bool operator>=(ap_fixed a, ap_fixed b) { return a.raw >= b.raw; }
  friend bool operator==(ap_fixed a, ap_fixed b) { return a.raw == b.raw; }
  friend bool operator!=(ap_fixed a, ap_fixed b) { return a.raw != b.raw; }
};

#endif  // vendor headers

namespace ft {

// Conversions used by the emitted code and the testbench.
template <typename T>
inline float to_float(const T& v) { return static_cast<float>(static_cast<double>(v)); }
template <typename T>
inline T from_float(float v) { return T(v); }

template <typename T>
inline T max(const T& a, const T& b) { return a < b ? b : a; }
template <typename T>
inline T min(const T& a, const T& b) { return b < a ? b : a; }
template <typename T>
inline T lowest() { return T(-3.0e38); }  // -inf surrogate, saturates in fixed point
template <>
inline float lowest<float>() { return -INFINITY; }
template <typename T>
inline T highest() { return T(3.0e38); }
template <>
inline float highest<float>() { return INFINITY; }

#define FT_UNARY(NAME, EXPR)                                   \
  inline float NAME(float x) { return EXPR; }                  \
  template <typename T>                                        \
  inline T NAME(const T& v) {                                  \
    const float x = to_float(v);                               \
    return T(EXPR);                                            \
  }
FT_UNARY(exp, std::exp(x))
FT_UNARY(log, std::log(x))
FT_UNARY(sqrt, std::sqrt(x))
FT_UNARY(rsqrt, 1.0f / std::sqrt(x))
FT_UNARY(tanh, std::tanh(x))
FT_UNARY(erf, std::erf(x))
FT_UNARY(sigmoid, 1.0f / (1.0f + std::exp(-x)))
FT_UNARY(fabs, std::fabs(x))
FT_UNARY(floor, std::floor(x))
FT_UNARY(ceil, std::ceil(x))
FT_UNARY(round, std::nearbyint(x))
FT_UNARY(trunc, std::trunc(x))
FT_UNARY(sin, std::sin(x))
FT_UNARY(cos, std::cos(x))
#undef FT_UNARY

inline float pow(float a, float b) { return std::pow(a, b); }
template <typename T>
inline T pow(const T& a, const T& b) { return T(std::pow(to_float(a), to_float(b))); }

// Bit casts between float32 and int32 (TIR reinterpret; e.g. TVM's fast_exp).
inline float bits_to_float(int32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
inline int32_t float_to_bits(float f) {
  int32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Integer division with floor semantics (TIR floordiv / floormod).
template <typename T>
inline T floordiv(T a, T b) {
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T>
inline T floormod(T a, T b) {
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

// Raw binary I/O of float32 tensors for the testbench.
inline bool read_floats(const char* path, float* dst, std::size_t n) {
  FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  const std::size_t got = std::fread(dst, sizeof(float), n, f);
  std::fclose(f);
  return got == n;
}
inline bool write_floats(const char* path, const float* src, std::size_t n) {
  FILE* f = std::fopen(path, "wb");
  if (!f) return false;
  const std::size_t put = std::fwrite(src, sizeof(float), n, f);
  std::fclose(f);
  return put == n;
}

}  // namespace ft

#endif  // FT_HLS_H_
