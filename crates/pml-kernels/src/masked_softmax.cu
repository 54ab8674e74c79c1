// Softmax of attention scores under the position mask, one block per row of scores: the CUDA
// side of `masked_softmax.rs` (same contract: row r belongs to the query at
// query_positions[r % n_queries], column k to the key at key_positions[k]; a query sees a key
// when key <= query and query - key < window; masked scores give 0, a row that sees nothing is
// all zeros). Compiled at run time by NVRTC, so it includes no header: f16 and bf16 are carried
// as 16-bit integers and converted here, the arithmetic is f32.

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(T x) { return x; }
    static __device__ __forceinline__ T store(float x) { return x; }
};

struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T x) {
        float out;
        asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(x));
        return out;
    }
    static __device__ __forceinline__ T store(float x) {
        T out;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(x));
        return out;
    }
};

struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T x) { return __uint_as_float(((unsigned)x) << 16); }
    // Round to nearest even, as candle's (and PyTorch's) conversions do; scores are never NaN.
    static __device__ __forceinline__ T store(float x) {
        unsigned bits = __float_as_uint(x);
        bits += 0x7fffu + ((bits >> 16) & 1u);
        return (T)(bits >> 16);
    }
};

#define THREADS 256
#define WARPS (THREADS / 32)

__device__ __forceinline__ float block_max(float value, float* shared) {
    for (int offset = 16; offset > 0; offset /= 2)
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
    __syncthreads();
    float out = shared[0];
    for (int warp = 1; warp < WARPS; ++warp) out = fmaxf(out, shared[warp]);
    __syncthreads();
    return out;
}

__device__ __forceinline__ float block_sum(float value, float* shared) {
    for (int offset = 16; offset > 0; offset /= 2)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
    __syncthreads();
    float out = 0.0f;
    for (int warp = 0; warp < WARPS; ++warp) out += shared[warp];
    __syncthreads();
    return out;
}

// Row `in`'s score at column k as the query at `query` sees it: -infinity for a key it may not
// see (whose exponential is then 0).
template <typename D>
__device__ __forceinline__ float masked_score(const typename D::T* in,
                                              const unsigned* key_positions, unsigned k,
                                              unsigned query, unsigned window) {
    const unsigned key = key_positions[k];
    return key <= query && query - key < window ? D::load(in[k]) : __int_as_float(0xff800000);
}

// `cache_row`: the launch gave the block n_keys floats of shared memory, so the row is read
// from global memory once (masked scores kept as -infinity) and the two later passes read it
// from there; else (rows too long for shared memory) every pass reads the scores again.
template <typename D>
__device__ void masked_softmax(const typename D::T* scores, typename D::T* out,
                               const unsigned* query_positions, const unsigned* key_positions,
                               unsigned n_queries, unsigned n_keys, unsigned window,
                               unsigned cache_row) {
    __shared__ float shared[WARPS];
    extern __shared__ float row_cache[];
    const size_t row = blockIdx.x;
    const typename D::T* in = scores + row * n_keys;
    typename D::T* written = out + row * n_keys;
    const unsigned query = query_positions[row % n_queries];
    const float hidden = __int_as_float(0xff800000);  // -infinity

    float max = hidden;
    for (unsigned k = threadIdx.x; k < n_keys; k += THREADS) {
        const float score = masked_score<D>(in, key_positions, k, query, window);
        if (cache_row) row_cache[k] = score;
        max = fmaxf(max, score);
    }
    max = block_max(max, shared);
    if (max == hidden) {
        for (unsigned k = threadIdx.x; k < n_keys; k += THREADS) written[k] = D::store(0.0f);
        return;
    }
    // Each thread reads back only the entries it wrote: no barrier needed for the cache.
    float sum = 0.0f;
    for (unsigned k = threadIdx.x; k < n_keys; k += THREADS) {
        const float score =
            cache_row ? row_cache[k] : masked_score<D>(in, key_positions, k, query, window);
        sum += expf(score - max);
    }
    const float inverse = 1.0f / block_sum(sum, shared);
    for (unsigned k = threadIdx.x; k < n_keys; k += THREADS) {
        const float score =
            cache_row ? row_cache[k] : masked_score<D>(in, key_positions, k, query, window);
        written[k] = D::store(expf(score - max) * inverse);
    }
}

#define MASKED_SOFTMAX(NAME, D)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                   \
        NAME(const D::T* scores, D::T* out, const unsigned* query_positions,                 \
             const unsigned* key_positions, unsigned n_queries, unsigned n_keys,             \
             unsigned window, unsigned cache_row) {                                          \
        masked_softmax<D>(scores, out, query_positions, key_positions, n_queries, n_keys,    \
                          window, cache_row);                                                \
    }

MASKED_SOFTMAX(masked_softmax_f32, F32)
MASKED_SOFTMAX(masked_softmax_f16, F16)
MASKED_SOFTMAX(masked_softmax_bf16, BF16)
