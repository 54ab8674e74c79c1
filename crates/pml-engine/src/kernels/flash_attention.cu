// Attention in one kernel, flash-style (FlashAttention-2's loop): the scores of a tile of keys
// live in registers, are masked by position, folded into a running softmax and multiplied by
// the tile's values at once, so no score is ever written to memory. The CUDA side of
// `flash_attention_cuda.rs`, same contract as `attend_by_ops`: a query at position q sees a
// key at position k when k <= q and q - k < window; a query that sees nothing gives zeros.
//
// Layout: queries (n_queries, n_heads, HEAD_DIM), keys and values (n_keys, n_kv_heads,
// HEAD_DIM), all f16 or bf16 and contiguous (the cache's own rows, read in place); the output
// (n_queries, n_heads, HEAD_DIM) in f32. The query heads sharing a KV head are stacked into
// rows (row r = query r / group, head kv_head * group + r % group), so a block of 64 rows
// reads each tile of its KV head once for all of them, and a decode step's few queries still
// fill rows.
//
// Block: 4 warps, 16 rows each; grid (row blocks, n_kv_heads). Products on tensor cores by
// `mma.sync.m16n8k16` (sm_80 and later), f32 accumulation. Compiled by NVRTC at run time,
// without headers: halves travel as 16-bit integers.

#define WARPS 4
#define THREADS (WARPS * 32)
#define BLOCK_ROWS (WARPS * 16)
#define TILE_KEYS 64
#define LOG2E 1.4426950408889634f

struct F16 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // Two floats as one register of halves, `low` in the lower half (the lower column).
    static __device__ __forceinline__ unsigned pack(float low, float high) {
        unsigned out;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(high), "f"(low));
        return out;
    }
};

struct BF16 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, unsigned b0,
                                               unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack(float low, float high) {
        unsigned out;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(high), "f"(low));
        return out;
    }
};

// NVRTC's built-in vector types are not relied on: these two are all the kernel needs.
struct __align__(16) Words4 {
    unsigned x, y, z, w;
};
struct __align__(8) Floats2 {
    float x, y;
};
typedef unsigned long long Index;

__device__ __forceinline__ unsigned load_pair(const unsigned short* at) {
    return *reinterpret_cast<const unsigned*>(at);
}

// The maximum over the four threads that hold one row's columns (lanes 4g .. 4g + 3).
__device__ __forceinline__ float row_max(float value) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
    return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float row_sum(float value) {
    value += __shfl_xor_sync(0xffffffffu, value, 1);
    return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// `block_queries[2b], [2b + 1]`: the least and greatest query position of row block b;
// `tile_keys[2t], [2t + 1]`: of key tile t. A tile no query of the block can see is skipped
// whole (the causal half of a prefill, keys beyond a sliding window).
template <typename D, int HEAD_DIM>
__device__ void flash_attention(const unsigned short* queries, const unsigned short* keys,
                                const unsigned short* values, float* out,
                                const unsigned* query_positions, const unsigned* key_positions,
                                const unsigned* block_queries, const unsigned* tile_keys,
                                unsigned n_queries, unsigned n_keys, unsigned n_heads,
                                unsigned n_kv_heads, unsigned window) {
    // Rows of the shared tiles are padded by 8 halves so the 8 rows one load instruction reads
    // fall in distinct banks.
    constexpr int K_STRIDE = HEAD_DIM + 8;
    constexpr int V_STRIDE = TILE_KEYS + 8;
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte pieces of a row
    __shared__ __align__(16) unsigned short k_tile[TILE_KEYS * K_STRIDE];
    // Values transposed, (HEAD_DIM, TILE_KEYS): the products' B operand reads pairs of keys.
    __shared__ __align__(16) unsigned short v_tile[HEAD_DIM * V_STRIDE];
    __shared__ unsigned tile_positions[TILE_KEYS];

    const unsigned group = n_heads / n_kv_heads;
    const unsigned kv_head = blockIdx.y;
    const unsigned n_rows = group * n_queries;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned first_row = blockIdx.x * BLOCK_ROWS + warp * 16;
    const unsigned rows[2] = {first_row + g, first_row + g + 8};
    bool valid[2];
    unsigned query_at[2];
    const unsigned short* query_row[2];
    for (int i = 0; i < 2; ++i) {
        valid[i] = rows[i] < n_rows;
        const unsigned query = valid[i] ? rows[i] / group : 0;
        const unsigned head = kv_head * group + (valid[i] ? rows[i] % group : 0);
        query_at[i] = query_positions[query];
        query_row[i] = queries + ((Index)query * n_heads + head) * HEAD_DIM;
    }
    const bool warp_busy = first_row < n_rows;

    // This warp's queries as the A operand of q kᵀ, one fragment per 16 columns.
    unsigned q[HEAD_DIM / 16][4];
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const int column = kk * 16 + 2 * t;
        q[kk][0] = valid[0] ? load_pair(query_row[0] + column) : 0u;
        q[kk][1] = valid[1] ? load_pair(query_row[1] + column) : 0u;
        q[kk][2] = valid[0] ? load_pair(query_row[0] + column + 8) : 0u;
        q[kk][3] = valid[1] ? load_pair(query_row[1] + column + 8) : 0u;
    }

    float o[HEAD_DIM / 8][4];
    for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
        for (int i = 0; i < 4; ++i) o[dt][i] = 0.0f;
    const float hidden = __int_as_float(0xff800000);  // -infinity
    float running_max[2] = {hidden, hidden};
    float running_sum[2] = {0.0f, 0.0f};  // this thread's columns only, summed at the end

    const unsigned least_query = block_queries[2 * blockIdx.x];
    const unsigned greatest_query = block_queries[2 * blockIdx.x + 1];
    const unsigned n_tiles = (n_keys + TILE_KEYS - 1) / TILE_KEYS;
    for (unsigned tile = 0; tile < n_tiles; ++tile) {
        // The same decision in every thread, so skipping never splits a barrier.
        const unsigned least_key = tile_keys[2 * tile], greatest_key = tile_keys[2 * tile + 1];
        if (least_key > greatest_query) continue;
        if (least_query >= greatest_key && least_query - greatest_key >= window) continue;
        const unsigned first_key = tile * TILE_KEYS;
        __syncthreads();  // the previous tile is no longer read
        for (unsigned piece = threadIdx.x; piece < TILE_KEYS * CHUNKS; piece += THREADS) {
            const unsigned key = piece / CHUNKS, chunk = piece % CHUNKS;
            Words4 k = {0u, 0u, 0u, 0u}, v = {0u, 0u, 0u, 0u};
            if (first_key + key < n_keys) {
                const Index at =
                    ((Index)(first_key + key) * n_kv_heads + kv_head) * HEAD_DIM + chunk * 8;
                k = *reinterpret_cast<const Words4*>(keys + at);
                v = *reinterpret_cast<const Words4*>(values + at);
            }
            *reinterpret_cast<Words4*>(&k_tile[key * K_STRIDE + chunk * 8]) = k;
            const unsigned words[4] = {v.x, v.y, v.z, v.w};
            for (int i = 0; i < 4; ++i) {
                v_tile[(chunk * 8 + 2 * i) * V_STRIDE + key] = (unsigned short)(words[i] & 0xffffu);
                v_tile[(chunk * 8 + 2 * i + 1) * V_STRIDE + key] = (unsigned short)(words[i] >> 16);
            }
        }
        for (unsigned key = threadIdx.x; key < TILE_KEYS; key += THREADS)
            // Past the last key: a position no query reaches (masked below by `key <= query`
            // failing, or by the window).
            tile_positions[key] = first_key + key < n_keys ? key_positions[first_key + key] : 0xffffffffu;
        __syncthreads();
        if (!warp_busy) continue;

        // Scores of this warp's 16 rows against the tile's 64 keys: 8 fragments of 8 keys.
        float s[TILE_KEYS / 8][4];
        for (int nt = 0; nt < TILE_KEYS / 8; ++nt) {
            for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
            const unsigned short* key_row = &k_tile[(nt * 8 + g) * K_STRIDE + 2 * t];
            for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
                D::mma(s[nt], q[kk], load_pair(key_row + kk * 16), load_pair(key_row + kk * 16 + 8));
        }
        // Mask, in base 2 (exp2 is one instruction): fragment element i holds row i / 2,
        // column nt * 8 + 2t + i % 2.
        float tile_max[2] = {hidden, hidden};
        for (int nt = 0; nt < TILE_KEYS / 8; ++nt)
            for (int i = 0; i < 4; ++i) {
                const unsigned key = tile_positions[nt * 8 + 2 * t + (i & 1)];
                const unsigned query = query_at[i / 2];
                const bool sees = valid[i / 2] && key <= query && query - key < window;
                s[nt][i] = sees ? s[nt][i] * LOG2E : hidden;
                tile_max[i / 2] = fmaxf(tile_max[i / 2], s[nt][i]);
            }
        float shift[2], rescale[2];
        for (int r = 0; r < 2; ++r) {
            const float maximum = fmaxf(running_max[r], row_max(tile_max[r]));
            // A row that has seen nothing yet keeps -infinity; shifting by 0 then gives
            // exp2(-inf) = 0 everywhere instead of NaN.
            shift[r] = maximum == hidden ? 0.0f : maximum;
            rescale[r] = exp2f(running_max[r] - shift[r]);
            running_max[r] = maximum;
            running_sum[r] *= rescale[r];
        }
        for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
            for (int i = 0; i < 4; ++i) o[dt][i] *= rescale[i / 2];
        for (int nt = 0; nt < TILE_KEYS / 8; ++nt)
            for (int i = 0; i < 4; ++i) {
                s[nt][i] = exp2f(s[nt][i] - shift[i / 2]);
                running_sum[i / 2] += s[nt][i];
            }
        // o += p v: p's fragments of 8 keys pair up into the A operand of 16 keys.
        for (int kk = 0; kk < TILE_KEYS / 16; ++kk) {
            const unsigned p[4] = {
                D::pack(s[2 * kk][0], s[2 * kk][1]),
                D::pack(s[2 * kk][2], s[2 * kk][3]),
                D::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                D::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
            for (int dt = 0; dt < HEAD_DIM / 8; ++dt) {
                const unsigned short* value_row = &v_tile[(dt * 8 + g) * V_STRIDE + kk * 16 + 2 * t];
                D::mma(o[dt], p, load_pair(value_row), load_pair(value_row + 8));
            }
        }
    }

    for (int r = 0; r < 2; ++r) {
        const float total = row_sum(running_sum[r]);
        if (!valid[r]) continue;
        const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
        const unsigned query = rows[r] / group, head = kv_head * group + rows[r] % group;
        float* out_row = out + ((Index)query * n_heads + head) * HEAD_DIM;
        for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
            *reinterpret_cast<Floats2*>(out_row + dt * 8 + 2 * t) =
                Floats2{o[dt][2 * r] * inverse, o[dt][2 * r + 1] * inverse};
    }
}

#define FLASH_ATTENTION(NAME, D, HEAD_DIM)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS)                                     \
        NAME(const unsigned short* queries, const unsigned short* keys,                       \
             const unsigned short* values, float* out, const unsigned* query_positions,       \
             const unsigned* key_positions, const unsigned* block_queries,                    \
             const unsigned* tile_keys, unsigned n_queries, unsigned n_keys, unsigned n_heads, \
             unsigned n_kv_heads, unsigned window) {                                          \
        flash_attention<D, HEAD_DIM>(queries, keys, values, out, query_positions,              \
                                     key_positions, block_queries, tile_keys, n_queries,       \
                                     n_keys, n_heads, n_kv_heads, window);                     \
    }

FLASH_ATTENTION(flash_attention_f16_64, F16, 64)
FLASH_ATTENTION(flash_attention_bf16_64, BF16, 64)
FLASH_ATTENTION(flash_attention_f16_128, F16, 128)
FLASH_ATTENTION(flash_attention_bf16_128, BF16, 128)
