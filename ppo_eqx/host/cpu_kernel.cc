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

// The kernels hold float vectors (vf) of one machine register: 16 floats with AVX-512 (32 registers), 8 with
// AVX2 (16 registers); FMA in both. Each register block (the sums a kernel keeps over its whole reduction) is
// sized for its register file, so that nothing spills: built for AVX2, the AVX-512 blocks of 16-float vectors
// were split by GCC into 128-bit pieces kept on the stack, and an update ran about 80 times slower. Without
// AVX2 and FMA the kernel is not built, and conv_impl="auto" takes the matmul route.
#if !defined(__AVX2__) || !defined(__FMA__)
#error "ppo_eqx's CPU kernel needs AVX2 and FMA (not in the -march it was built for), the matmul route is used instead"
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <immintrin.h>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // floats in one vector register
constexpr int kMaxVectors = 4;  // channel vectors of one register block; more channels take more passes
// Register blocks (of 32 registers): positions x vectors of output channels for the forward passes and the input
// gradient, input taps x vectors for the weight gradients.
constexpr int kFirstPositions = 10;  // first_conv forward: 10 x 2 (32 channels)
constexpr int kFirstTaps = 8;  // first_conv weight gradient: 8 x 2
constexpr int kConvPositions = 6;  // conv forward: 6 x 4 (64 channels)
constexpr int kConvTaps = 6;  // conv weight gradient: 6 x 4
constexpr int kInputGradientSums = 24;  // conv input gradient: 24 / Q positions x Q (C = 16 Q channels)
#else
constexpr int kLanes = 8;
constexpr int kMaxVectors = 2;
// Of 16 registers: 12 sums (6 x 2 vectors, 16 channels at a time), 2 loaded vectors and 1 broadcast.
constexpr int kFirstPositions = 6;
constexpr int kFirstTaps = 6;
constexpr int kConvPositions = 6;
constexpr int kConvTaps = 6;
constexpr int kInputGradientSums = 12;
#endif
typedef float vf __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));  // unaligned loads, stores
constexpr int64_t kOut = 32;  // first_conv's output channels

// Vectors of output channels per register block for `channels` of them: all where they fit.
constexpr int vectors_for(int64_t channels) {
  return static_cast<int>(std::min<int64_t>(channels / kLanes, kMaxVectors));
}

// Named so that XLA's handler macros, which split their arguments on commas, can take them.
using Frames = ffi::Buffer<ffi::U8, 4>;
using Array4 = ffi::Buffer<ffi::F32, 4>;
using Vector = ffi::Buffer<ffi::F32, 1>;

inline vf load(const float* p) { return *reinterpret_cast<const vf*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }

// strip(std::integral_constant<int, J>(), first) for first = 0, J, 2 J, ... while J fit in n, then once for the
// rest (fewer than J) as a strip of its own size: a register block of J positions (or taps) at a time. The
// blocks are functions of their own (noinline): inlined into the loops around them, their inner loops ran out of
// general registers for the row offsets and read them from the stack (first_conv's forward pass 5% slower).
template <int J, typename Strip>
void in_strips(int64_t n, Strip&& strip) {
  int64_t first = 0;
  for (; first + J <= n; first += J) strip(std::integral_constant<int, J>(), first);
  if constexpr (J > 1) {
    if (first < n) in_strips<J - 1>(n - first, [&](auto size, int64_t rest) { strip(size, first + rest); });
  }
}

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
#if defined(__AVX512F__)
        _mm512_storeu_ps(dst, _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), _mm512_set1_ps(255.0f)));
#else
        const __m256 scale = _mm256_set1_ps(255.0f);
        _mm256_storeu_ps(dst, _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), scale));
        _mm256_storeu_ps(dst + 8, _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))), scale));
#endif
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

// Outputs (i, j0) .. (i, j0 + J - 1), channels o0 .. o0 + Q * kLanes - 1, kept in J * Q registers over the k*k*D
// products.
template <int J, int Q>
[[gnu::noinline]] void forward_strip(const float* xf, int64_t W, int64_t D, int64_t k, const float* kernel, const float* bias,
                   int64_t i, int64_t j0, int64_t o0, float* out) {
  vf acc[J][Q];
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < Q; ++q) acc[j][q] = load(bias + o0 + q * kLanes);
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const float* kab = kernel + (a * k + b) * D * kOut + o0;
      const float* xab = xf + ((i + a) * W + j0 + b) * D;
      for (int64_t d = 0; d < D; ++d) {
        vf kv[Q];
        for (int q = 0; q < Q; ++q) kv[q] = load(kab + d * kOut + q * kLanes);
        for (int j = 0; j < J; ++j) {
          const float v = xab[j * D + d];
          for (int q = 0; q < Q; ++q) acc[j][q] += v * kv[q];
        }
      }
    }
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < Q; ++q) store(out + j * kOut + o0 + q * kLanes, acc[j][q]);
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
      for (int64_t i = 0; i < OH; ++i)
        in_strips<kFirstPositions>(OW, [&](auto size, int64_t j) {
          constexpr int Q = vectors_for(kOut);
          for (int64_t o0 = 0; o0 < kOut; o0 += Q * kLanes)
            forward_strip<size(), Q>(xf.data(), f.Wf, f.D, k, kp, bp, i, j, o0, out + (i * OW + j) * kOut);
        });
    }
  });
  return ffi::Error::Success();
}

// dkernel[a, b, d0 .. d0 + T - 1, o0 .. o0 + Q * kLanes - 1] += sum over the frame's outputs (i, j) of
// x[i + a, j + b, d] * dy[i, j, o]: T * Q registers of sums, Q loads of dy and T broadcasts of x per T * Q
// multiply-adds.
template <int T, int Q>
[[gnu::noinline]] void weight_gradient_block(const float* xf, const float* dy, int64_t W, int64_t D, int64_t OH, int64_t OW,
                           int64_t a, int64_t b, int64_t d0, int64_t o0, float* o) {
  if (OH < 1 || OW < 1) return;  // without this path GCC moved half the sums between registers at every step
  vf acc[T][Q];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < Q; ++q) acc[t][q] = load(o + t * kOut + q * kLanes);
  for (int64_t i = 0; i < OH; ++i) {
    const float* xr = xf + ((i + a) * W + b) * D + d0;
    const float* gr = dy + i * OW * kOut + o0;
    for (int64_t j = 0; j < OW; ++j) {
      vf g[Q];
      for (int q = 0; q < Q; ++q) g[q] = load(gr + j * kOut + q * kLanes);
      const float* xv = xr + j * D;
      for (int t = 0; t < T; ++t) {
        const float v = xv[t];
        for (int q = 0; q < Q; ++q) acc[t][q] += v * g[q];
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < Q; ++q) store(o + t * kOut + q * kLanes, acc[t][q]);
}

// dkernel += the frame's weight gradient, kFirstTaps taps of depth at a time.
void weight_gradient_frame(const float* xf, const float* dy, int64_t W, int64_t D, int64_t k, int64_t OH,
                           int64_t OW, float* dkernel) {
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b)
      in_strips<kFirstTaps>(D, [&](auto taps, int64_t d0) {
        constexpr int Q = vectors_for(kOut);
        for (int64_t o0 = 0; o0 < kOut; o0 += Q * kLanes)
          weight_gradient_block<taps(), Q>(xf, dy, W, D, OH, OW, a, b, d0, o0,
                                           dkernel + ((a * k + b) * D + d0) * kOut + o0);
      });
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
constexpr int64_t kConv = 64;  // output channels

// Outputs of J positions (their windows at base[0..J-1]), channels o0 .. o0 + Q * kLanes - 1, kept in J * Q
// registers over the k*k*C products; written to out[0 .. 64 J) (rows of 64 channels).
template <int J, int Q>
[[gnu::noinline]] void conv_forward_strip(const float* const* base, int64_t W, int64_t C, int64_t k, const float* kernel,
                        const float* bias, int64_t o0, float* out) {
  vf acc[J][Q];
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < Q; ++q) acc[j][q] = load(bias + o0 + q * kLanes);
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      const int64_t off = (a * W + b) * C;
      const float* kab = kernel + (a * k + b) * C * kConv + o0;
      for (int64_t c = 0; c < C; ++c) {
        vf kv[Q];
        for (int q = 0; q < Q; ++q) kv[q] = load(kab + c * kConv + q * kLanes);
        for (int j = 0; j < J; ++j) {
          const float v = base[j][off + c];
          for (int q = 0; q < Q; ++q) acc[j][q] += v * kv[q];
        }
      }
    }
  for (int j = 0; j < J; ++j)
    for (int q = 0; q < Q; ++q) store(out + j * kConv + o0 + q * kLanes, acc[j][q]);
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
      in_strips<kConvPositions>(positions, [&](auto size, int64_t p) {
        constexpr int Q = vectors_for(kConv);
        for (int64_t o0 = 0; o0 < kConv; o0 += Q * kLanes)
          conv_forward_strip<size(), Q>(base.data() + p, sh.W, sh.C, sh.k, kp, bp, o0, out + p * kConv);
      });
    }
  });
  return ffi::Error::Success();
}

// dkernel[a, b, c0 .. c0 + T - 1, o0 .. o0 + Q * kLanes - 1] += sum over a frame's P positions of
// x[window + tap (a, b), c] * dy[p, o]: T * Q registers of sums, Q loads of dy and T broadcasts of x per T * Q
// multiply-adds. `off` is the tap's offset plus c0 within a window; `o` points at dkernel[a, b, c0, o0].
template <int T, int Q>
[[gnu::noinline]] void conv_weight_gradient_block(const float* const* base, const float* dy, int64_t P, int64_t off, int64_t o0,
                                float* o) {
  vf acc[T][Q];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < Q; ++q) acc[t][q] = load(o + t * kConv + q * kLanes);
  for (int64_t p = 0; p < P; ++p) {
    const float* g = dy + p * kConv + o0;
    vf gv[Q];
    for (int q = 0; q < Q; ++q) gv[q] = load(g + q * kLanes);
    const float* xv = base[p] + off;
    for (int t = 0; t < T; ++t) {
      const float v = xv[t];
      for (int q = 0; q < Q; ++q) acc[t][q] += v * gv[q];
    }
  }
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < Q; ++q) store(o + t * kConv + q * kLanes, acc[t][q]);
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
          in_strips<kConvTaps>(sh.C, [&](auto taps, int64_t c0) {
            constexpr int Q = vectors_for(kConv);
            for (int64_t o0 = 0; o0 < kConv; o0 += Q * kLanes)
              conv_weight_gradient_block<taps(), Q>(base.data(), g, P, off + c0, o0, o + c0 * kConv + o0);
          });
        }
    }
  });
  add_partial_sums(partial, chunks, taps, dkernel->typed_data());
  return ffi::Error::Success();
}

// dx at J input positions of one row, columns q0, q0 + s, ..., all sharing the residue of q0 modulo s and so
// the same taps, channels c0 .. c0 + Q * kLanes - 1 of C: dx[p, q] = sum over taps (a, b) with s | (p - a),
// s | (q - b) of kernel[a, b] . dy[(p - a) / s, (q - b) / s]. dy is padded by k positions on every side
// (zeros), so that every tap reads inside it; kernel_t is the kernel as [k, k, 64, C]. J * Q registers of sums.
template <int J, int Q>
[[gnu::noinline]] void conv_input_gradient_strip(const float* dy_pad, int64_t OHp, int64_t OWp, int64_t k, int64_t s, int64_t C,
                               int64_t p, int64_t q0, int64_t c0, const float* kernel_t, float* dx, int64_t dx_step) {
  vf acc[J][Q];
  for (int t = 0; t < J; ++t)
    for (int v = 0; v < Q; ++v) acc[t][v] = vf{};
  for (int64_t a = 0; a < k; ++a) {
    if ((p + s * k - a) % s) continue;
    const int64_t ip = (p + s * k - a) / s;
    if (ip < k || ip >= OHp - k) continue;  // a row of padding: adds nothing
    for (int64_t b = 0; b < k; ++b) {
      if ((q0 + s * k - b) % s) continue;
      const int64_t jp = (q0 + s * k - b) / s;
      if (jp + J <= k || jp >= OWp - k) continue;  // only columns of padding
      const float* g = dy_pad + (ip * OWp + jp) * kConv;
      const float* kt = kernel_t + (a * k + b) * kConv * C + c0;
      for (int64_t o = 0; o < kConv; ++o) {
        vf kv[Q];
        for (int v = 0; v < Q; ++v) kv[v] = load(kt + o * C + v * kLanes);
        for (int t = 0; t < J; ++t) {
          const float d = g[t * kConv + o];
          for (int v = 0; v < Q; ++v) acc[t][v] += d * kv[v];
        }
      }
    }
  }
  for (int t = 0; t < J; ++t)
    for (int v = 0; v < Q; ++v) store(dx + t * dx_step + c0 + v * kLanes, acc[t][v]);
}

// A frame's dx, Q vectors of channels (C / (Q * kLanes) blocks of them) at kInputGradientSums / Q positions at a
// time.
template <int Q>
void conv_input_gradient_frame(const float* dy_pad, int64_t OWp, const ConvShape& sh, const float* kernel_t,
                               float* dx) {
  const int64_t C = sh.C, rows = sh.s * (sh.OH - 1) + sh.k, cols = sh.s * (sh.OW - 1) + sh.k;
  std::memset(dx, 0, sh.H * sh.W * C * sizeof(float));  // rows and columns past the last window stay zero
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t r = 0; r < std::min(sh.s, cols); ++r)  // columns r, r + s, ... below cols
      in_strips<kInputGradientSums / Q>((cols - r + sh.s - 1) / sh.s, [&](auto size, int64_t first) {
        const int64_t q0 = r + first * sh.s;
        for (int64_t c0 = 0; c0 < C; c0 += Q * kLanes)
          conv_input_gradient_strip<size(), Q>(dy_pad, sh.OH + 2 * sh.k, OWp, sh.k, sh.s, C, p, q0, c0, kernel_t,
                                               dx + (p * sh.W + q0) * C, sh.s * C);
      });
}

// conv_input_gradient_frame<vectors> for vectors <= Q (and at least one multiple of 16 channels).
template <int Q>
void conv_input_gradient_frame_of(int vectors, const float* dy_pad, int64_t OWp, const ConvShape& sh,
                                  const float* kernel_t, float* dx) {
  if constexpr (Q > vectors_for(16)) {
    if (vectors < Q) return conv_input_gradient_frame_of<Q - 1>(vectors, dy_pad, OWp, sh, kernel_t, dx);
  }
  conv_input_gradient_frame<Q>(dy_pad, OWp, sh, kernel_t, dx);
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
      conv_input_gradient_frame_of<kMaxVectors>(vectors_for(sh.C), dy_pad.data(), OWp, sh, kp, out);
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

// The floats in one of the kernel's vectors (16: built for AVX-512; 8: for AVX2), for cpu_kernel.isa().
extern "C" int PpoEqxVectorLanes() { return kLanes; }
