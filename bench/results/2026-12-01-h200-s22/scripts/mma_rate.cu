// mma.sync m16n8k16 (fp32 accumulate) issue rate, bf16 against fp16: each warp issues CHAINS independent MMAs
// per iteration; cycles from clock64() inside the kernel (independent of the SM clock), time from CUDA events.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

template <bool BF16, int CHAINS>
__global__ void mma_loop(float* out, long long* cycles, int iters) {
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
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < CHAINS; j++) {
      if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  long long t1 = clock64();
  float s = 0.f;
  for (int j = 0; j < CHAINS; j++) for (int i = 0; i < 4; i++) s += c[j][i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <bool BF16, int CHAINS>
void run(int blocks_per_sm, int warps, int iters, int sms) {
  int blocks = blocks_per_sm * sms, threads = 32 * warps;
  float* out; long long* cyc;
  cudaMalloc(&out, sizeof(float) * blocks * threads);
  cudaMalloc(&cyc, sizeof(long long) * blocks);
  mma_loop<BF16, CHAINS><<<blocks, threads>>>(out, cyc, 10);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  long long* hc = new long long[blocks];
  double mean_cycles = 0;
  for (int r = 0; r < 5; r++) {
    cudaEventRecord(e0);
    mma_loop<BF16, CHAINS><<<blocks, threads>>>(out, cyc, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) {
      best = ms;
      cudaMemcpy(hc, cyc, sizeof(long long) * blocks, cudaMemcpyDeviceToHost);
      mean_cycles = 0; for (int i = 0; i < blocks; i++) mean_cycles += hc[i]; mean_cycles /= blocks;
    }
  }
  double mmas_per_sm = double(blocks_per_sm) * warps * iters * CHAINS;
  double flops = 2.0 * 16 * 8 * 16 * mmas_per_sm * sms;
  printf("%s chains %d warps/SM %2d: %7.1f TFLOP/s, %.3f SM cycles per MMA per SM (%.2f GHz from cycles/time)\n",
         BF16 ? "bf16" : "fp16", CHAINS, blocks_per_sm * warps, flops / best / 1e9,
         mean_cycles / (mmas_per_sm), mean_cycles / best / 1e6);
  cudaFree(out); cudaFree(cyc); delete[] hc;
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int w : {4, 8, 16}) {
    run<true, 8>(2, w / 2, 20000, sms);
    run<false, 8>(2, w / 2, 20000, sms);
  }
  run<true, 4>(2, 4, 20000, sms);
  run<false, 4>(2, 4, 20000, sms);
  return 0;
}
