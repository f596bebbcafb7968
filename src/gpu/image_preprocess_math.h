// The per-output-element arithmetic of the image backend's resize / centre crop / normalize /
// layout step, written once for the CPU path (src/backends/image/image_transform.cc) and the
// CUDA kernel (image_preprocess_kernel.cu), so that both produce the same bits.
//
// Exactness: every floating-point operation goes through MulF/AddF/... (and the double ones),
// which on the device are the round-to-nearest intrinsics that nvcc never fuses into an FMA;
// on the host they are the plain operators (x86-64 without -mfma, as this project builds, does
// not contract them either; a build for an FMA target, -march=native, must compile
// image_transform.cc with -ffp-contract=off, or the GPU test, KernelEqualsCpuBitForBit, fails). Everything else is integer arithmetic. So a value computed here on
// the host equals the one the kernel computes, and both equal the CPU path's, bit for bit.
//
// The FP16 output is the FP32 value rounded to the nearest half, ties to even (HalfBits):
// integer arithmetic on the float's bits, the same on both sides, so FP16 agrees bit for bit
// too (and equals CUDA's __float2half_rn, which rounds the same way).
//
// Plain C++17, no includes beyond <cstdint>/<cmath>/<cstring>: nvcc compiles it without Abseil.
#ifndef INFERD_GPU_IMAGE_PREPROCESS_MATH_H_
#define INFERD_GPU_IMAGE_PREPROCESS_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define INFERD_HOST_DEVICE __host__ __device__
#else
#define INFERD_HOST_DEVICE
#endif

namespace inferd::gpu::image_math {

// ---- Unfused arithmetic (see the file comment) ----
INFERD_HOST_DEVICE inline float MulF(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
INFERD_HOST_DEVICE inline float AddF(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
INFERD_HOST_DEVICE inline float SubF(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
INFERD_HOST_DEVICE inline double MulD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
INFERD_HOST_DEVICE inline double AddD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
// IEEE division (correctly rounded on the device too: double `/` is not approximated).
INFERD_HOST_DEVICE inline double DivD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
INFERD_HOST_DEVICE inline float FloorF(float v) {
#if defined(__CUDA_ARCH__)
  return floorf(v);
#else
  return std::floor(v);
#endif
}
INFERD_HOST_DEVICE inline int MinI(int a, int b) { return a < b ? a : b; }

// ---- Sampling along one axis ----

// Where output position `d` reads along an axis of `in` source pixels resized to `resized`,
// with the window starting `offset` resized pixels in (the centre crop): half-pixel centres
// (align_corners=False, no antialiasing), src = (d + offset + 0.5) * in / resized - 0.5 clamped
// at 0; bilinear reads lo and hi = min(lo + 1, in - 1) with weight `frac` on hi. Nearest reads
// floor((d + offset + 0.5) * in / resized), clamped to in - 1, with frac 0 (lo == hi).
struct AxisTap {
  int lo = 0;
  int hi = 0;
  float frac = 0.0f;
};

INFERD_HOST_DEVICE inline AxisTap TapAt(int in, int resized, int offset, int d, bool nearest) {
  const double scale = DivD(static_cast<double>(in), static_cast<double>(resized));
  const double centre = MulD(AddD(static_cast<double>(d + offset), 0.5), scale);
  AxisTap t;
  if (nearest) {
    t.lo = t.hi = MinI(static_cast<int>(centre), in - 1);
    return t;
  }
  double src = AddD(centre, -0.5);
  if (src < 0.0) src = 0.0;
  t.lo = MinI(static_cast<int>(src), in - 1);
  t.hi = MinI(t.lo + 1, in - 1);
  t.frac = static_cast<float>(AddD(src, -static_cast<double>(t.lo)));
  return t;
}

// ---- One channel of one output pixel ----

// a + w * (b - a), unfused.
INFERD_HOST_DEVICE inline float Lerp(float a, float b, float w) {
  return AddF(a, MulF(w, SubF(b, a)));
}

// The bilinear blend of the four source values around the sample point (for nearest, all four
// are the same pixel and the weights 0, which gives that pixel's value exactly).
INFERD_HOST_DEVICE inline float Blend(uint8_t p00, uint8_t p01, uint8_t p10, uint8_t p11,
                                      float wx, float wy) {
  const float top = Lerp(static_cast<float>(p00), static_cast<float>(p01), wx);
  const float bottom = Lerp(static_cast<float>(p10), static_cast<float>(p11), wx);
  return Lerp(top, bottom, wy);
}

// value = (v * scale - mean) / std, folded at load into one multiply and one add per channel:
// mul = scale / std, add = -mean / std (float arithmetic, as the CPU path always did).
INFERD_HOST_DEVICE inline void NormalizeCoefficients(float scale, float mean, float std_dev,
                                                     float* mul, float* add) {
  *mul = scale / std_dev;
  *add = -mean / std_dev;
}
INFERD_HOST_DEVICE inline float Normalize(float v, float mul, float add) {
  return AddF(MulF(v, mul), add);
}

// The UINT8 output: round half up, clamped to [0, 255].
INFERD_HOST_DEVICE inline uint8_t ToUint8(float v) {
  float r = FloorF(AddF(v, 0.5f));
  r = r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r);
  return static_cast<uint8_t>(r);
}

// IEEE binary16 bits of `v` rounded to nearest, ties to even (IEEE 754's default rounding, and
// numpy's float32 -> float16): overflow (|v| >= 65520) gives infinity, values below half the
// smallest subnormal give signed zero, NaN stays NaN. Integer arithmetic only (numpy's
// npy_floatbits_to_halfbits), so host and device give the same bits.
INFERD_HOST_DEVICE inline uint16_t HalfBits(float v) {
#if defined(__CUDA_ARCH__)
  const uint32_t f = __float_as_uint(v);
#else
  uint32_t f;
  std::memcpy(&f, &v, sizeof f);
#endif
  const uint16_t sign = static_cast<uint16_t>((f & 0x80000000u) >> 16);
  const uint32_t exp = f & 0x7f800000u;
  if (exp >= 0x47800000u) {  // |v| >= 2^16: infinity, or NaN / infinity already
    const uint32_t sig = f & 0x007fffffu;
    if (exp == 0x7f800000u && sig != 0) {
      uint16_t nan = static_cast<uint16_t>(0x7c00u + (sig >> 13));
      if (nan == 0x7c00u) ++nan;  // a payload only in the low bits: still a NaN
      return static_cast<uint16_t>(sign + nan);
    }
    return static_cast<uint16_t>(sign + 0x7c00u);
  }
  if (exp <= 0x38000000u) {  // |v| < 2^-14: a subnormal half or zero
    if (exp < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t e = exp >> 23;
    uint32_t sig = 0x00800000u + (f & 0x007fffffu);
    // Shifted so that the half's last bit is bit 13; up to 11 bits fall off the end, which
    // the tie test below takes back from `f`.
    sig >>= (113 - e);
    if ((sig & 0x00003fffu) != 0x00001000u || (f & 0x000007ffu) != 0) sig += 0x00001000u;
    // A carry into the exponent gives the smallest normal: right.
    return static_cast<uint16_t>(sign + (sig >> 13));
  }
  const uint32_t half_exp = (exp - 0x38000000u) >> 13;
  uint32_t sig = f & 0x007fffffu;
  if ((sig & 0x00003fffu) != 0x00001000u) sig += 0x00001000u;  // not an exact tie to even
  // A carry into the exponent is right, up to infinity at 65520.
  return static_cast<uint16_t>(sign + (sig >> 13) + half_exp);
}

// Where channel `c` of output pixel `pixel` (= y * width + x) lies in one item of the output.
INFERD_HOST_DEVICE inline int64_t OutputIndex(bool nchw, int c, int64_t pixel, int64_t plane) {
  return nchw ? c * plane + pixel : pixel * 3 + c;
}

// ---- The whole step, per output element (what the kernel runs in each thread) ----

// Everything one item needs, computed on the host from the settings and the image's size
// (image_transform.h: MathParamsFor). Plain data: passed to the kernel by value.
struct PreprocessParams {
  int src_width = 0;
  int src_height = 0;
  int out_width = 0;
  int out_height = 0;
  int resized_width = 0;
  int resized_height = 0;
  int crop_left = 0;
  int crop_top = 0;
  bool nearest = false;
  bool nchw = true;
  bool uint8_output = false;  // else FP32 (or FP16 with fp16_output)
  bool fp16_output = false;   // the FP32 value rounded to half (HalfBits)
  int source_channel[3] = {0, 1, 2};  // output channel c reads source channel source_channel[c]
  float mul[3] = {1.0f, 1.0f, 1.0f};
  float add[3] = {0.0f, 0.0f, 0.0f};
};

INFERD_HOST_DEVICE inline int64_t OutputElements(const PreprocessParams& p) {
  return static_cast<int64_t>(p.out_height) * p.out_width * 3;
}

// The resized (not yet normalized) value of output element `index` (in the output's layout)
// from the HWC 3-channel uint8 image `pixels` (src_height x src_width x 3, packed rows).
INFERD_HOST_DEVICE inline float ResizedValue(const uint8_t* pixels, const PreprocessParams& p,
                                             int64_t index) {
  const int64_t plane = static_cast<int64_t>(p.out_height) * p.out_width;
  int c;
  int64_t pixel;
  if (p.nchw) {
    c = static_cast<int>(index / plane);
    pixel = index - c * plane;
  } else {
    c = static_cast<int>(index % 3);
    pixel = index / 3;
  }
  const int y = static_cast<int>(pixel / p.out_width);
  const int x = static_cast<int>(pixel - static_cast<int64_t>(y) * p.out_width);
  const AxisTap tx = TapAt(p.src_width, p.resized_width, p.crop_left, x, p.nearest);
  const AxisTap ty = TapAt(p.src_height, p.resized_height, p.crop_top, y, p.nearest);
  const int64_t stride = static_cast<int64_t>(p.src_width) * 3;
  const uint8_t* row0 = pixels + stride * ty.lo;
  const uint8_t* row1 = pixels + stride * ty.hi;
  const int sc = p.source_channel[c];
  return Blend(row0[3 * tx.lo + sc], row0[3 * tx.hi + sc], row1[3 * tx.lo + sc],
               row1[3 * tx.hi + sc], tx.frac, ty.frac);
}

INFERD_HOST_DEVICE inline float Fp32Element(const uint8_t* pixels, const PreprocessParams& p,
                                            int64_t index) {
  const int c = p.nchw ? static_cast<int>(index / (static_cast<int64_t>(p.out_height) *
                                                   p.out_width))
                       : static_cast<int>(index % 3);
  return Normalize(ResizedValue(pixels, p, index), p.mul[c], p.add[c]);
}

// The FP16 output: the FP32 element rounded to half, as binary16 bits.
INFERD_HOST_DEVICE inline uint16_t Fp16Element(const uint8_t* pixels, const PreprocessParams& p,
                                               int64_t index) {
  return HalfBits(Fp32Element(pixels, p, index));
}

INFERD_HOST_DEVICE inline uint8_t Uint8Element(const uint8_t* pixels, const PreprocessParams& p,
                                               int64_t index) {
  return ToUint8(ResizedValue(pixels, p, index));
}

}  // namespace inferd::gpu::image_math

#endif  // INFERD_GPU_IMAGE_PREPROCESS_MATH_H_
