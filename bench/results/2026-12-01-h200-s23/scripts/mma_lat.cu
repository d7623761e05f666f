// mma.sync m16n8k16 (fp32 accumulate): latency of a dependent chain, and issue rate with FFMA/MUFU work between
// the MMAs, bf16 against fp16. Cycles from clock64() inside the kernel.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

template <bool BF16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if (BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// CHAINS independent accumulators; after each round of MMAs, FMAS dependent-free FFMAs and EXPS ex2 per thread.
template <bool BF16, int CHAINS, int FMAS, int EXPS>
__global__ void loop(float* out, long long* cycles, int iters) {
  uint32_t a[4], b[2];
  uint32_t h = (blockIdx.x * blockDim.x + threadIdx.x) * 2654435761u;
  for (int i = 0; i < 4; i++) {
    h = h * 1664525u + 1013904223u;
    uint32_t lo = BF16 ? (0x3f80u | (h & 0x7fu)) : (0x3c00u | (h & 0x3ffu));
    uint32_t hi = BF16 ? (0xbf80u | ((h >> 8) & 0x7fu)) : (0xbc00u | ((h >> 10) & 0x3ffu));
    a[i] = lo | (hi << 16);
  }
  b[0] = a[1] ^ 0x00010001u; b[1] = a[2] ^ 0x00020002u;
  float c[CHAINS][4];
  for (int j = 0; j < CHAINS; j++) for (int i = 0; i < 4; i++) c[j][i] = 0.f;
  float f[8];
  for (int i = 0; i < 8; i++) f[i] = 1.0f + 1e-3f * (threadIdx.x + i);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < CHAINS; j++) mma<BF16>(c[j], a, b);
#pragma unroll
    for (int i = 0; i < FMAS; i++) f[i % 8] = fmaf(f[i % 8], 0.999f, 1e-4f);
#pragma unroll
    for (int i = 0; i < EXPS; i++) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(f[i % 8] * -0.01f));
      f[(i + 3) % 8] += y;
    }
  }
  long long t1 = clock64();
  float s = 0.f;
  for (int j = 0; j < CHAINS; j++) for (int i = 0; i < 4; i++) s += c[j][i];
  for (int i = 0; i < 8; i++) s += f[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <bool BF16, int CHAINS, int FMAS, int EXPS>
void run(int blocks_per_sm, int warps, int iters, int sms) {
  int blocks = blocks_per_sm * sms, threads = 32 * warps;
  float* out; long long* cyc;
  cudaMalloc(&out, sizeof(float) * blocks * threads);
  cudaMalloc(&cyc, sizeof(long long) * blocks);
  loop<BF16, CHAINS, FMAS, EXPS><<<blocks, threads>>>(out, cyc, 10);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  long long* hc = new long long[blocks];
  double mean_cycles = 0;
  for (int r = 0; r < 5; r++) {
    cudaEventRecord(e0);
    loop<BF16, CHAINS, FMAS, EXPS><<<blocks, threads>>>(out, cyc, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) {
      best = ms;
      cudaMemcpy(hc, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
      mean_cycles = 0; for (int i = 0; i < blocks; i++) mean_cycles += hc[i]; mean_cycles /= blocks;
    }
  }
  printf("%s chains %2d fma %2d exp %2d warps/SM %2d: %8.2f cycles an iteration of a warp, %7.1f TFLOP/s\n",
         BF16 ? "bf16" : "fp16", CHAINS, FMAS, EXPS, blocks_per_sm * warps, mean_cycles / iters,
         2.0 * 16 * 8 * 16 * CHAINS * double(iters) * blocks * warps / best / 1e9);
  cudaFree(out); cudaFree(cyc); delete[] hc;
}

#define BOTH(C, F, E, B, W) run<true, C, F, E>(B, W, 20000, sms); run<false, C, F, E>(B, W, 20000, sms);

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  BOTH(1, 0, 0, 1, 1)    // latency of a dependent MMA
  BOTH(2, 0, 0, 1, 1)
  BOTH(4, 0, 0, 1, 1)
  BOTH(8, 0, 0, 1, 1)    // one warp's rate
  BOTH(16, 0, 0, 1, 1)
  BOTH(8, 0, 0, 1, 4)    // one warp per scheduler
  BOTH(8, 0, 0, 2, 4)    // two warps per scheduler (our sm80 D=128 kernel: 2 blocks of 4 warps)
  BOTH(8, 8, 0, 2, 4)
  BOTH(8, 16, 4, 2, 4)
  BOTH(8, 32, 8, 2, 4)
  BOTH(16, 32, 8, 2, 4)
  BOTH(4, 16, 4, 2, 4)
  return 0;
}
