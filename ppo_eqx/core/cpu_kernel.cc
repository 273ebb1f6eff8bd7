// The Nature CNN's three convolutions on XLA:CPU, by hand. First, the first layer: forward and weight gradient
// (the other two, 64 output channels, follow further down).
//
// Both read the frames as the env returns them, uint8 [B, C, H, W], and fold each frame by the layer's
// stride s (space-to-depth) into a float buffer, scaled by 1/255, that stays in cache: the layer is then a
// stride-1 convolution with a small k x k kernel [k, k, s*s*C, 32]. Nothing the size of the batch is written
// except the layer's output. XLA's own route (one matmul of every position by all k*k kernel slices, then a
// shifted sum; its gradient, a k*k-wide stack of shifted cotangents times the input) writes and reads k*k
// times the output, and its weight gradient, a 64x128 product over 100k rows, runs at half the machine's
// matmul rate; XLA's relayout of the uint8 frames alone took a fifth of a batch-8 forward pass. See
// networks.py and docs/performance.md.
//
// Registered with XLA through its FFI (xla/ffi/api/ffi.h, shipped with jaxlib); built by cpu_kernel.py.

// The kernels hold 16-float vectors (v16) in registers, 24-28 at a time. Without AVX-512, GCC splits each into
// 128-bit pieces kept on the stack: measured, an update ran about 80 times slower than with AVX-512. So the
// kernel is not built there, and conv_impl="auto" takes the matmul route.
#if !defined(__AVX512F__)
#error "ppo_eqx's CPU kernel needs AVX-512 (-march=native found none), the matmul route is used instead"
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <immintrin.h>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// 16 floats (one AVX-512 register where the machine has them); unaligned loads and stores.
typedef float v16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kOut = 32;  // output channels: two v16 per position

// Named so that XLA's handler macros, which split their arguments on commas, can take them.
using Frames = ffi::Buffer<ffi::U8, 4>;
using Array4 = ffi::Buffer<ffi::F32, 4>;
using Vector = ffi::Buffer<ffi::F32, 1>;

inline v16 load(const float* p) { return *reinterpret_cast<const v16*>(p); }
inline void store(float* p, v16 v) { *reinterpret_cast<v16*>(p) = v; }

struct Work {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t n = 0;
  std::function<void(int64_t)> body;
};

void drain(Work& work) {
  for (int64_t c = work.next.fetch_add(1); c < work.n; c = work.next.fetch_add(1)) {
    work.body(c);
    work.done.fetch_add(1);
  }
}

// body(0), ..., body(n - 1) on the calling thread and on up to n - 1 of XLA's intra-op threads. Chunks are
// claimed one by one, so a helper that starts late finds none left and returns without touching the
// buffers; the caller waits only for chunks already running. Nothing waits on a queued task: no deadlock
// when XLA's threads are all busy.
void parallel_for(ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t)> body) {
  auto work = std::make_shared<Work>();
  work->n = n;
  work->body = std::move(body);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([work] { drain(*work); });
  drain(*work);
  while (work->done.load() < n) std::this_thread::yield();
}

// out = the sum of `chunks` partial sums of `taps` floats each (one per thread of a weight gradient), added in
// chunk order.
void add_partial_sums(const std::vector<float>& partial, int64_t chunks, int64_t taps, float* out) {
  std::memcpy(out, partial.data(), taps * sizeof(float));
  for (int64_t c = 1; c < chunks; ++c)
    for (int64_t t = 0; t < taps; ++t) out[t] += partial[c * taps + t];
}

// The shape of a fold: frames [C, H, W] read as [Hf, Wf, D] with D = s*s*C (the rows and columns a VALID
// convolution with a k*s kernel reads, cropped to a multiple of s).
struct Fold {
  int64_t C = 0, H = 0, W = 0, s = 1, Hf = 0, Wf = 0, D = 0;
  Fold() = default;
  Fold(int64_t C, int64_t H, int64_t W, int64_t s, int64_t k)
      : C(C), H(H), W(W), s(s), Hf((H - k * s) / s + k), Wf((W - k * s) / s + k), D(s * s * C) {}
  int64_t frame() const { return C * H * W; }
  int64_t folded() const { return Hf * Wf * D; }
};

// xf[i, j, (r * s + c) * C + ch] = x[ch, i * s + r, j * s + c] / 255: the frame folded as networks.space_to_depth
// folds it. `row` holds one image row of all channels, (column, channel) interleaved.
void fold_frame_any(const uint8_t* x, const Fold& f, float* xf, float* row) {
  const int64_t tile = f.s * f.C;  // one row of a tile: s columns of C channels
  for (int64_t y = 0; y < f.Hf * f.s; ++y) {
    for (int64_t ch = 0; ch < f.C; ++ch) {
      const uint8_t* src = x + (ch * f.H + y) * f.W;
      for (int64_t u = 0; u < f.Wf * f.s; ++u) row[u * f.C + ch] = static_cast<float>(src[u]) / 255.0f;
    }
    float* dst = xf + (y / f.s) * f.Wf * f.D + (y % f.s) * tile;
    for (int64_t j = 0; j < f.Wf; ++j) std::memcpy(dst + j * f.D, row + j * tile, tile * sizeof(float));
  }
}

// fold_frame_any for Atari's fold (4 x 4 tiles of 4 channels: a tile row is 16 bytes): each tile row is four
// 4-byte loads, one byte shuffle from (channel, column) to (column, channel) order, and one conversion of 16
// bytes to floats. The same numbers as fold_frame_any; GCC's own lowering of the shuffle is scalar.
void fold_frame_4x4(const uint8_t* x, const Fold& f, float* xf) {
  const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const int64_t plane = f.H * f.W;
  auto word = [](const uint8_t* p) {
    int32_t w;
    std::memcpy(&w, p, 4);
    return w;
  };
  for (int64_t i = 0; i < f.Hf; ++i)  // in xf's order: its writes are sequential
    for (int64_t j = 0; j < f.Wf; ++j)
      for (int64_t r = 0; r < 4; ++r) {
        const uint8_t* src = x + (i * 4 + r) * f.W + j * 4;
        const __m128i bytes = _mm_shuffle_epi8(
            _mm_setr_epi32(word(src), word(src + plane), word(src + 2 * plane), word(src + 3 * plane)), order);
        float* dst = xf + (i * f.Wf + j) * f.D + r * 16;
        _mm512_storeu_ps(dst, _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), _mm512_set1_ps(255.0f)));
      }
}

void fold_frame(const uint8_t* x, const Fold& f, float* xf, float* row) {
  if (f.s == 4 && f.C == 4) return fold_frame_4x4(x, f, xf);
  fold_frame_any(x, f, xf, row);
}

// The fold of frames [B, C, H, W] at stride s for a kernel [k, k, s*s*C, 32] (s*s*C a multiple of 8), or an
// error saying what the shapes must be.
ffi::Error fold_shape(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> kd, int64_t s, Fold& fold) {
  const int64_t k = kd[0];
  if (xd.size() != 4 || s < 1 || k < 1 || kd[1] != k || kd[3] != kOut || xd[2] < k * s || xd[3] < k * s ||
      kd[2] != s * s * xd[1] || kd[2] % 8)
    return ffi::Error::InvalidArgument(
        "ppo_eqx first_conv: frames must be [B, C, H, W] with H, W >= k*s, and the kernel [k, k, s*s*C, 32] with "
        "s*s*C a multiple of 8");
  fold = Fold(xd[1], xd[2], xd[3], s, k);
  return ffi::Error::Success();
}

// Outputs (i, j0) .. (i, j0 + J - 1), all 32 channels, kept in 2J registers over the k*k*D products.
template <int J>
void forward_strip(const float* xf, int64_t W, int64_t D, int64_t k, const float* kernel, const float* bias,
                   int64_t i, int64_t j0, float* out) {
  v16 lo[J], hi[J];
  for (int j = 0; j < J; ++j) lo[j] = load(bias), hi[j] = load(bias + 16);
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const float* kab = kernel + (a * k + b) * D * kOut;
      const float* xab = xf + ((i + a) * W + j0 + b) * D;
      for (int64_t d = 0; d < D; ++d) {
        const v16 k_lo = load(kab + d * kOut), k_hi = load(kab + d * kOut + 16);
        for (int j = 0; j < J; ++j) {
          const float v = xab[j * D + d];
          lo[j] += v * k_lo;
          hi[j] += v * k_hi;
        }
      }
    }
  for (int j = 0; j < J; ++j) store(out + j * kOut, lo[j]), store(out + j * kOut + 16, hi[j]);
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, Frames x, Array4 kernel, Vector bias, int64_t stride,
                       ffi::Result<Array4> y) {
  Fold f;
  if (auto error = fold_shape(x.dimensions(), kernel.dimensions(), stride, f); error.failure()) return error;
  const int64_t B = x.dimensions()[0], k = kernel.dimensions()[0];
  const int64_t OH = f.Hf - k + 1, OW = f.Wf - k + 1;
  const uint8_t* xp = x.typed_data();
  const float* kp = kernel.typed_data();
  const float* bp = bias.typed_data();
  float* yp = y->typed_data();
  const int64_t chunks = std::min<int64_t>(B, 4 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<float> xf(f.folded()), row(f.Wf * f.s * f.C);
    for (int64_t n = B * c / chunks; n < B * (c + 1) / chunks; ++n) {
      fold_frame(xp + n * f.frame(), f, xf.data(), row.data());
      float* out = yp + n * OH * OW * kOut;
      for (int64_t i = 0; i < OH; ++i) {
        int64_t j = 0;
        for (; j + 10 <= OW; j += 10)
          forward_strip<10>(xf.data(), f.Wf, f.D, k, kp, bp, i, j, out + (i * OW + j) * kOut);
        for (; j < OW; ++j) forward_strip<1>(xf.data(), f.Wf, f.D, k, kp, bp, i, j, out + (i * OW + j) * kOut);
      }
    }
  });
  return ffi::Error::Success();
}

// dkernel[a, b, d, :] += sum over the frame's outputs (i, j) of x[i + a, j + b, d] * dy[i, j, :], for eight
// d at a time: 16 registers of sums, two loads of dy and eight broadcasts of x per 16 multiply-adds.
void weight_gradient_frame(const float* xf, const float* dy, int64_t W, int64_t D, int64_t k, int64_t OH,
                           int64_t OW, float* dkernel) {
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b)
      for (int64_t d0 = 0; d0 < D; d0 += 8) {
        float* o = dkernel + ((a * k + b) * D + d0) * kOut;
        v16 lo[8], hi[8];
        for (int t = 0; t < 8; ++t) lo[t] = load(o + t * kOut), hi[t] = load(o + t * kOut + 16);
        for (int64_t i = 0; i < OH; ++i) {
          const float* xr = xf + ((i + a) * W + b) * D + d0;
          const float* gr = dy + i * OW * kOut;
          for (int64_t j = 0; j < OW; ++j) {
            const v16 g_lo = load(gr + j * kOut), g_hi = load(gr + j * kOut + 16);
            const float* xv = xr + j * D;
            for (int t = 0; t < 8; ++t) {
              lo[t] += xv[t] * g_lo;
              hi[t] += xv[t] * g_hi;
            }
          }
        }
        for (int t = 0; t < 8; ++t) store(o + t * kOut, lo[t]), store(o + t * kOut + 16, hi[t]);
      }
}

ffi::Error WeightGradientImpl(ffi::ThreadPool pool, Frames x, Array4 dy, int64_t stride,
                              ffi::Result<Array4> dkernel) {
  Fold f;
  if (auto error = fold_shape(x.dimensions(), dkernel->dimensions(), stride, f); error.failure()) return error;
  const auto gd = dy.dimensions();
  const int64_t B = x.dimensions()[0], k = dkernel->dimensions()[0];
  const int64_t OH = f.Hf - k + 1, OW = f.Wf - k + 1, taps = k * k * f.D * kOut;
  if (gd[0] != B || gd[1] != OH || gd[2] != OW || gd[3] != kOut)
    return ffi::Error::InvalidArgument("ppo_eqx first_conv: dy must be the layer's output shape");
  const uint8_t* xp = x.typed_data();
  const float* gp = dy.typed_data();
  // One partial sum per chunk (thread), added up at the end.
  const int64_t chunks = std::min<int64_t>(B, std::max<int64_t>(1, pool.num_threads()));
  std::vector<float> partial(chunks * taps, 0.0f);
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<float> xf(f.folded()), row(f.Wf * f.s * f.C);
    for (int64_t n = B * c / chunks; n < B * (c + 1) / chunks; ++n) {
      fold_frame(xp + n * f.frame(), f, xf.data(), row.data());
      weight_gradient_frame(xf.data(), gp + n * OH * OW * kOut, f.Wf, f.D, k, OH, OW, partial.data() + c * taps);
    }
  });
  add_partial_sums(partial, chunks, taps, dkernel->typed_data());
  return ffi::Error::Success();
}

// The Nature CNN's other convolutions (64 output channels, float NHWC input [B, H, W, C] with C a multiple of
// 16, kernel [k, k, C, 64], any stride): forward, input gradient and weight gradient, each computing exactly
// the layer's products. XLA's route folds the stride into channels and multiplies at positions that the
// shifted sums then drop (23% and 29% more products than the layers have for conv2 and conv3), and
// relayouts its inputs and cotangents around each product. Each output position reads its window straight
// from the input: position p's window starts at base[p], tap (a, b) at base[p] + (a * W + b) * C.
constexpr int64_t kConv = 64;  // output channels: four v16

// Outputs of J positions (their windows at base[0..J-1]), all 64 channels, kept in 4J registers over the
// k*k*C products; written to out[0 .. 64 J).
template <int J>
void conv_forward_strip(const float* const* base, int64_t W, int64_t C, int64_t k, const float* kernel,
                        const float* bias, float* out) {
  v16 acc[J][4];
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < 4; ++q) acc[j][q] = load(bias + 16 * q);
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const int64_t off = (a * W + b) * C;
      const float* kab = kernel + (a * k + b) * C * kConv;
      for (int64_t c = 0; c < C; ++c) {
        const float* kc = kab + c * kConv;
        const v16 k0 = load(kc), k1 = load(kc + 16), k2 = load(kc + 32), k3 = load(kc + 48);
        for (int j = 0; j < J; ++j) {
          const float v = base[j][off + c];
          acc[j][0] += v * k0;
          acc[j][1] += v * k1;
          acc[j][2] += v * k2;
          acc[j][3] += v * k3;
        }
      }
    }
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < 4; ++q) store(out + j * kConv + 16 * q, acc[j][q]);
}

// The window starts of a frame's OH x OW output positions, in output order.
void window_starts(const float* frame, int64_t W, int64_t C, int64_t s, int64_t OH, int64_t OW,
                   std::vector<const float*>& base) {
  base.resize(OH * OW);
  for (int64_t i = 0; i < OH; ++i)
    for (int64_t j = 0; j < OW; ++j) base[i * OW + j] = frame + (s * i * W + s * j) * C;
}

struct ConvShape {
  int64_t B, H, W, C, k, s, OH, OW;
};

ffi::Error conv_shape(ffi::Span<const int64_t> xd, int64_t k, int64_t kernel_c, int64_t kernel_o, int64_t s,
                      ConvShape& shape) {
  if (xd.size() != 4 || s < 1 || k < 1 || xd[1] < k || xd[2] < k || kernel_c != xd[3] || xd[3] % 16 ||
      kernel_o != kConv)
    return ffi::Error::InvalidArgument(
        "ppo_eqx conv: x must be [B, H, W, C] with C a multiple of 16 and H, W >= k, the kernel [k, k, C, 64]");
  shape = {xd[0], xd[1], xd[2], xd[3], k, s, (xd[1] - k) / s + 1, (xd[2] - k) / s + 1};
  return ffi::Error::Success();
}

ffi::Error ConvForwardImpl(ffi::ThreadPool pool, Array4 x, Array4 kernel, Vector bias, int64_t stride,
                           ffi::Result<Array4> y) {
  const auto kd = kernel.dimensions();
  ConvShape sh;
  if (auto error = conv_shape(x.dimensions(), kd[0], kd[2], kd[3], stride, sh); error.failure()) return error;
  const float* xp = x.typed_data();
  const float* kp = kernel.typed_data();
  const float* bp = bias.typed_data();
  float* yp = y->typed_data();
  const int64_t positions = sh.OH * sh.OW;
  const int64_t chunks = std::min<int64_t>(sh.B, 4 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<const float*> base;
    for (int64_t n = sh.B * c / chunks; n < sh.B * (c + 1) / chunks; ++n) {
      window_starts(xp + n * sh.H * sh.W * sh.C, sh.W, sh.C, sh.s, sh.OH, sh.OW, base);
      float* out = yp + n * positions * kConv;
      int64_t p = 0;
      for (; p + 6 <= positions; p += 6)
        conv_forward_strip<6>(base.data() + p, sh.W, sh.C, sh.k, kp, bp, out + p * kConv);
      for (; p + 3 <= positions; p += 3)
        conv_forward_strip<3>(base.data() + p, sh.W, sh.C, sh.k, kp, bp, out + p * kConv);
      for (; p < positions; ++p) conv_forward_strip<1>(base.data() + p, sh.W, sh.C, sh.k, kp, bp, out + p * kConv);
    }
  });
  return ffi::Error::Success();
}

// dkernel[a, b, c0 .. c0 + T, :] += sum over a frame's P positions of x[window + tap (a, b), c] * dy[p, :]:
// 4T registers of sums, four loads of dy and T broadcasts of x per 4T multiply-adds.
template <int T>
void conv_weight_gradient_block(const float* const* base, const float* dy, int64_t P, int64_t off, float* o) {
  v16 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < 4; ++q) acc[t][q] = load(o + t * kConv + 16 * q);
  for (int64_t p = 0; p < P; ++p) {
    const float* g = dy + p * kConv;
    const v16 g0 = load(g), g1 = load(g + 16), g2 = load(g + 32), g3 = load(g + 48);
    const float* xv = base[p] + off;
    for (int t = 0; t < T; ++t) {
      const float v = xv[t];
      acc[t][0] += v * g0;
      acc[t][1] += v * g1;
      acc[t][2] += v * g2;
      acc[t][3] += v * g3;
    }
  }
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < 4; ++q) store(o + t * kConv + 16 * q, acc[t][q]);
}

ffi::Error ConvWeightGradientImpl(ffi::ThreadPool pool, Array4 x, Array4 dy, int64_t stride,
                                  ffi::Result<Array4> dkernel) {
  const auto kd = dkernel->dimensions(), gd = dy.dimensions();
  ConvShape sh;
  if (auto error = conv_shape(x.dimensions(), kd[0], kd[2], kd[3], stride, sh); error.failure()) return error;
  if (kd[1] != sh.k || gd[0] != sh.B || gd[1] != sh.OH || gd[2] != sh.OW || gd[3] != kConv)
    return ffi::Error::InvalidArgument("ppo_eqx conv: dy must be the layer's output shape [B, OH, OW, 64]");
  const float* xp = x.typed_data();
  const float* gp = dy.typed_data();
  const int64_t P = sh.OH * sh.OW, taps = sh.k * sh.k * sh.C * kConv;
  const int64_t chunks = std::min<int64_t>(sh.B, std::max<int64_t>(1, pool.num_threads()));
  std::vector<float> partial(chunks * taps, 0.0f);
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<const float*> base;
    float* sums = partial.data() + c * taps;
    for (int64_t n = sh.B * c / chunks; n < sh.B * (c + 1) / chunks; ++n) {
      window_starts(xp + n * sh.H * sh.W * sh.C, sh.W, sh.C, sh.s, sh.OH, sh.OW, base);
      const float* g = gp + n * P * kConv;
      for (int64_t a = 0; a < sh.k; ++a)
        for (int64_t b = 0; b < sh.k; ++b) {
          const int64_t off = (a * sh.W + b) * sh.C;
          float* o = sums + (a * sh.k + b) * sh.C * kConv;
          int64_t c0 = 0;
          for (; c0 + 6 <= sh.C; c0 += 6) conv_weight_gradient_block<6>(base.data(), g, P, off + c0, o + c0 * kConv);
          for (; c0 + 2 <= sh.C; c0 += 2) conv_weight_gradient_block<2>(base.data(), g, P, off + c0, o + c0 * kConv);
        }
    }
  });
  add_partial_sums(partial, chunks, taps, dkernel->typed_data());
  return ffi::Error::Success();
}

// dx at J input positions of one row, columns q0, q0 + s, ..., all sharing the residue of q0 modulo s and so
// the same taps: dx[p, q] = sum over taps (a, b) with s | (p - a), s | (q - b) of
// kernel[a, b] . dy[(p - a) / s, (q - b) / s]. dy is padded by k positions on every side (zeros), so that
// every tap reads inside it; kernel_t is the kernel as [k, k, 64, C]. NV = C / 16 registers per position.
template <int J, int NV>
void conv_input_gradient_strip(const float* dy_pad, int64_t OHp, int64_t OWp, int64_t k, int64_t s, int64_t p,
                               int64_t q0, const float* kernel_t, float* dx, int64_t dx_step) {
  constexpr int64_t C = 16 * NV;
  v16 acc[J][NV];
  for (int t = 0; t < J; ++t)
    for (int v = 0; v < NV; ++v) acc[t][v] = v16{};
  for (int64_t a = 0; a < k; ++a) {
    if ((p + s * k - a) % s) continue;
    const int64_t ip = (p + s * k - a) / s;
    if (ip < k || ip >= OHp - k) continue;  // a row of padding: adds nothing
    for (int64_t b = 0; b < k; ++b) {
      if ((q0 + s * k - b) % s) continue;
      const int64_t jp = (q0 + s * k - b) / s;
      if (jp + J <= k || jp >= OWp - k) continue;  // only columns of padding
      const float* g = dy_pad + (ip * OWp + jp) * kConv;
      const float* kt = kernel_t + (a * k + b) * kConv * C;
      for (int64_t o = 0; o < kConv; ++o) {
        v16 kv[NV];
        for (int v = 0; v < NV; ++v) kv[v] = load(kt + o * C + 16 * v);
        for (int t = 0; t < J; ++t) {
          const float d = g[t * kConv + o];
          for (int v = 0; v < NV; ++v) acc[t][v] += d * kv[v];
        }
      }
    }
  }
  for (int t = 0; t < J; ++t)
    for (int v = 0; v < NV; ++v) store(dx + t * dx_step + 16 * v, acc[t][v]);
}

// The n columns q0, q0 + s, ... of input row p in strips of J, then of fewer for the rest.
template <int J, int NV>
void conv_input_gradient_strips(int64_t n, const float* dy_pad, int64_t OWp, const ConvShape& sh, int64_t p,
                                int64_t q0, const float* kernel_t, float* dx) {
  if constexpr (J > 0) {
    constexpr int64_t C = 16 * NV;
    for (; n >= J; n -= J, q0 += J * sh.s, dx += J * sh.s * C)
      conv_input_gradient_strip<J, NV>(dy_pad, sh.OH + 2 * sh.k, OWp, sh.k, sh.s, p, q0, kernel_t, dx, sh.s * C);
    conv_input_gradient_strips<J - 1, NV>(n, dy_pad, OWp, sh, p, q0, kernel_t, dx);
  }
}

template <int NV>
void conv_input_gradient_frame(const float* dy_pad, int64_t OWp, const ConvShape& sh, const float* kernel_t,
                               float* dx) {
  const int64_t C = 16 * NV, rows = sh.s * (sh.OH - 1) + sh.k, cols = sh.s * (sh.OW - 1) + sh.k;
  std::memset(dx, 0, sh.H * sh.W * C * sizeof(float));  // rows and columns past the last window stay zero
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t r = 0; r < std::min(sh.s, cols); ++r)  // columns r, r + s, ... below cols
      conv_input_gradient_strips<24 / NV, NV>((cols - r + sh.s - 1) / sh.s, dy_pad, OWp, sh, p, r, kernel_t,
                                              dx + (p * sh.W + r) * C);
}

ffi::Error ConvInputGradientImpl(ffi::ThreadPool pool, Array4 dy, Array4 kernel_t, int64_t stride,
                                 ffi::Result<Array4> dx) {
  const auto kd = kernel_t.dimensions(), gd = dy.dimensions();
  ConvShape sh;
  if (auto error = conv_shape(dx->dimensions(), kd[0], kd[3], kd[2], stride, sh); error.failure()) return error;
  if (kd[1] != sh.k || gd[0] != sh.B || gd[1] != sh.OH || gd[2] != sh.OW || gd[3] != kConv || sh.C > 64)
    return ffi::Error::InvalidArgument("ppo_eqx conv: dy must be [B, OH, OW, 64] and C at most 64");
  const float* gp = dy.typed_data();
  const float* kp = kernel_t.typed_data();
  float* xp = dx->typed_data();
  const int64_t OHp = sh.OH + 2 * sh.k, OWp = sh.OW + 2 * sh.k;
  const int64_t chunks = std::min<int64_t>(sh.B, 4 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<float> dy_pad(OHp * OWp * kConv, 0.0f);
    for (int64_t n = sh.B * c / chunks; n < sh.B * (c + 1) / chunks; ++n) {
      const float* g = gp + n * sh.OH * sh.OW * kConv;
      for (int64_t i = 0; i < sh.OH; ++i)
        std::memcpy(dy_pad.data() + ((i + sh.k) * OWp + sh.k) * kConv, g + i * sh.OW * kConv,
                    sh.OW * kConv * sizeof(float));
      float* out = xp + n * sh.H * sh.W * sh.C;
      switch (sh.C / 16) {
        case 1: conv_input_gradient_frame<1>(dy_pad.data(), OWp, sh, kp, out); break;
        case 2: conv_input_gradient_frame<2>(dy_pad.data(), OWp, sh, kp, out); break;
        case 3: conv_input_gradient_frame<3>(dy_pad.data(), OWp, sh, kp, out); break;
        default: conv_input_gradient_frame<4>(dy_pad.data(), OWp, sh, kp, out); break;
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxFirstConvForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Frames>()
                                  .Arg<Array4>()
                                  .Arg<Vector>()
                                  .Attr<int64_t>("stride")
                                  .Ret<Array4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxFirstConvWeightGradient, WeightGradientImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Frames>()
                                  .Arg<Array4>()
                                  .Attr<int64_t>("stride")
                                  .Ret<Array4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxConvForward, ConvForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Array4>()
                                  .Arg<Array4>()
                                  .Arg<Vector>()
                                  .Attr<int64_t>("stride")
                                  .Ret<Array4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxConvInputGradient, ConvInputGradientImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Array4>()
                                  .Arg<Array4>()
                                  .Attr<int64_t>("stride")
                                  .Ret<Array4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxConvWeightGradient, ConvWeightGradientImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Array4>()
                                  .Arg<Array4>()
                                  .Attr<int64_t>("stride")
                                  .Ret<Array4>());
