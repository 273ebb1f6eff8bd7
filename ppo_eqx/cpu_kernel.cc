// The Nature CNN's first convolution on XLA:CPU, by hand: forward and weight gradient.
//
// Both read the frames as ppo_eqx stores them, uint8 and folded by the layer's stride (space-to-depth):
// x [B, H, W, D], so the layer is a stride-1 convolution with a small k x k kernel [k, k, D, 32]. Each
// frame is scaled by 1/255 into a float buffer that stays in cache, and nothing the size of the batch is
// written except the layer's output. XLA's own route (one matmul of every position by all k*k kernel
// slices, then a shifted sum; its gradient, a k*k-wide stack of shifted cotangents times the input)
// writes and reads k*k times the output, and its weight gradient, a 64x128 product over 100k rows, runs
// at half the machine's matmul rate. See networks.py and README's Speed section.
//
// Registered with XLA through its FFI (xla/ffi/api/ffi.h, shipped with jaxlib); built by cpu_kernel.py.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
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

void scale_frame(const uint8_t* x, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) out[t] = static_cast<float>(x[t]) / 255.0f;
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

ffi::Error ForwardImpl(ffi::ThreadPool pool, Frames x, Array4 kernel, Vector bias, ffi::Result<Array4> y) {
  const auto xd = x.dimensions(), kd = kernel.dimensions();
  const int64_t B = xd[0], H = xd[1], W = xd[2], D = xd[3], k = kd[0];
  if (kd[1] != k || kd[2] != D || kd[3] != kOut || k > H || k > W)
    return ffi::Error::InvalidArgument("ppo_eqx first_conv: kernel must be [k, k, D, 32] with k <= H, W");
  const int64_t OH = H - k + 1, OW = W - k + 1, frame = H * W * D;
  const uint8_t* xp = x.typed_data();
  const float* kp = kernel.typed_data();
  const float* bp = bias.typed_data();
  float* yp = y->typed_data();
  const int64_t chunks = std::min<int64_t>(B, 4 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<float> xf(frame);
    for (int64_t f = B * c / chunks; f < B * (c + 1) / chunks; ++f) {
      scale_frame(xp + f * frame, frame, xf.data());
      float* out = yp + f * OH * OW * kOut;
      for (int64_t i = 0; i < OH; ++i) {
        int64_t j = 0;
        for (; j + 10 <= OW; j += 10) forward_strip<10>(xf.data(), W, D, k, kp, bp, i, j, out + (i * OW + j) * kOut);
        for (; j < OW; ++j) forward_strip<1>(xf.data(), W, D, k, kp, bp, i, j, out + (i * OW + j) * kOut);
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

ffi::Error WeightGradientImpl(ffi::ThreadPool pool, Frames x, Array4 dy, ffi::Result<Array4> dkernel) {
  const auto xd = x.dimensions(), gd = dy.dimensions(), kd = dkernel->dimensions();
  const int64_t B = xd[0], H = xd[1], W = xd[2], D = xd[3], k = kd[0];
  const int64_t OH = H - k + 1, OW = W - k + 1, frame = H * W * D, taps = k * k * D * kOut;
  if (kd[1] != k || kd[2] != D || kd[3] != kOut || D % 8 || gd[0] != B || gd[1] != OH || gd[2] != OW || gd[3] != kOut)
    return ffi::Error::InvalidArgument("ppo_eqx first_conv: dy must be [B, H-k+1, W-k+1, 32], D a multiple of 8");
  const uint8_t* xp = x.typed_data();
  const float* gp = dy.typed_data();
  // One partial sum per chunk (thread), added up at the end.
  const int64_t chunks = std::min<int64_t>(B, std::max<int64_t>(1, pool.num_threads()));
  std::vector<float> partial(chunks * taps, 0.0f);
  parallel_for(pool, chunks, [&](int64_t c) {
    std::vector<float> xf(frame);
    for (int64_t f = B * c / chunks; f < B * (c + 1) / chunks; ++f) {
      scale_frame(xp + f * frame, frame, xf.data());
      weight_gradient_frame(xf.data(), gp + f * OH * OW * kOut, W, D, k, OH, OW, partial.data() + c * taps);
    }
  });
  float* out = dkernel->typed_data();
  std::memcpy(out, partial.data(), taps * sizeof(float));
  for (int64_t c = 1; c < chunks; ++c)
    for (int64_t t = 0; t < taps; ++t) out[t] += partial[c * taps + t];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxFirstConvForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Frames>()
                                  .Arg<Array4>()
                                  .Arg<Vector>()
                                  .Ret<Array4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PpoEqxFirstConvWeightGradient, WeightGradientImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<Frames>()
                                  .Arg<Array4>()
                                  .Ret<Array4>());
