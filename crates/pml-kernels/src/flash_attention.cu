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
// `mma.sync.m16n8k16`, f32 accumulation. Tiles of keys and values are copied to shared memory
// by `cp.async` into two buffers, so the next visible tile is in flight while this one is
// multiplied; the values' operand is read transposed by `ldmatrix.trans`. All of it sm_80
// (Ampere) and later. Compiled by NVRTC at run time, without headers: halves travel as 16-bit
// integers.

#define WARPS 4
#define THREADS (WARPS * 32)
#define BLOCK_ROWS (WARPS * 16)
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

struct __align__(8) Floats2 {
    float x, y;
};
typedef unsigned long long Index;

__device__ __forceinline__ unsigned load_pair(const unsigned short* at) {
    return *reinterpret_cast<const unsigned*>(at);
}

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
    unsigned address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
        : "=r"(address)
        : "l"(pointer));
    return address;
}

// 16 bytes from global to shared memory, not through registers; `bytes` 0 writes zeros.
__device__ __forceinline__ void copy_async(unsigned destination, const void* source,
                                           unsigned bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(destination),
                 "l"(source), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void commit_copies() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most `Pending` groups of copies are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

// Four 8×8 matrices of halves, transposed: register i from the rows lanes 8i .. 8i + 7 point at.
__device__ __forceinline__ void load_transposed(unsigned* b, unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(address)
                 : "memory");
}

// 2^x, one instruction (relative error ~2^-22; 2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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
// `tile_keys[2t], [2t + 1]`: of key tile t. The first tile from `tile` on that some query of
// the block may see (n_tiles when none is): the causal half of a prefill and keys beyond a
// sliding window are skipped whole. The same answer in every thread, so no barrier is split.
__device__ __forceinline__ unsigned next_visible(unsigned tile, unsigned n_tiles,
                                                 const unsigned* tile_keys,
                                                 unsigned least_query, unsigned greatest_query,
                                                 unsigned window) {
    for (; tile < n_tiles; ++tile) {
        const unsigned least_key = tile_keys[2 * tile], greatest_key = tile_keys[2 * tile + 1];
        const bool after = least_key > greatest_query;
        const bool beyond = least_query >= greatest_key && least_query - greatest_key >= window;
        if (!after && !beyond) break;
    }
    return tile;
}

// Rows of the shared tiles are padded by 8 halves, so the 8 rows one load reads fall in
// distinct banks and each row stays 16-byte aligned.
template <int HEAD_DIM, int TILE_KEYS>
struct Tiles {
    static constexpr int STRIDE = HEAD_DIM + 8;
    static constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte pieces of a row
    unsigned short keys[2][TILE_KEYS * STRIDE];
    unsigned short values[2][TILE_KEYS * STRIDE];
    unsigned positions[2][TILE_KEYS];
};

// Starts the copies of key tile `tile` of `kv_head` into `buffer` (rows past the last key:
// zeros, at a position no query reaches) and commits them as one group.
template <int HEAD_DIM, int TILE_KEYS>
__device__ __forceinline__ void load_tile(Tiles<HEAD_DIM, TILE_KEYS>& tiles, int buffer,
                                          unsigned tile, const unsigned short* keys,
                                          const unsigned short* values,
                                          const unsigned* key_positions, unsigned n_keys,
                                          unsigned n_kv_heads, unsigned kv_head) {
    typedef Tiles<HEAD_DIM, TILE_KEYS> T;
    const unsigned first_key = tile * TILE_KEYS;
    for (unsigned piece = threadIdx.x; piece < TILE_KEYS * T::CHUNKS; piece += THREADS) {
        const unsigned key = piece / T::CHUNKS, chunk = piece % T::CHUNKS;
        const bool inside = first_key + key < n_keys;
        const Index at =
            inside ? ((Index)(first_key + key) * n_kv_heads + kv_head) * HEAD_DIM + chunk * 8 : 0;
        const unsigned bytes = inside ? 16u : 0u;
        copy_async(shared_address(&tiles.keys[buffer][key * T::STRIDE + chunk * 8]), keys + at,
                   bytes);
        copy_async(shared_address(&tiles.values[buffer][key * T::STRIDE + chunk * 8]),
                   values + at, bytes);
    }
    for (unsigned key = threadIdx.x; key < TILE_KEYS; key += THREADS)
        tiles.positions[buffer][key] =
            first_key + key < n_keys ? key_positions[first_key + key] : 0xffffffffu;
    commit_copies();
}

template <typename D, int HEAD_DIM, int TILE_KEYS>
__device__ void flash_attention(const unsigned short* queries, const unsigned short* keys,
                                const unsigned short* values, float* out,
                                const unsigned* query_positions, const unsigned* key_positions,
                                const unsigned* block_queries, const unsigned* tile_keys,
                                unsigned n_queries, unsigned n_keys, unsigned n_heads,
                                unsigned n_kv_heads, unsigned window) {
    typedef Tiles<HEAD_DIM, TILE_KEYS> T;
    __shared__ __align__(16) T tiles;

    const unsigned group = n_heads / n_kv_heads;
    const unsigned kv_head = blockIdx.y;
    const unsigned n_rows = group * n_queries;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned g = lane / 4, t = lane % 4;
    // The last row blocks first: in a causal prefill they see the most tiles, and starting
    // them early keeps the short ones for the tail of the grid.
    const unsigned row_block = gridDim.x - 1 - blockIdx.x;
    const unsigned first_row = row_block * BLOCK_ROWS + warp * 16;
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

    const unsigned least_query = block_queries[2 * row_block];
    const unsigned greatest_query = block_queries[2 * row_block + 1];
    // This warp's least and greatest query position (its rows all real): a tile whose keys
    // all precede the least, within the window of the greatest, is seen whole by every row,
    // and its scores skip the mask (all but the diagonal tiles of a causal prefill).
    unsigned warp_least_query = 0xffffffffu, warp_greatest_query = 0u;
    for (int i = 0; i < 2; ++i) {
        if (!valid[i]) continue;
        warp_least_query = query_at[i] < warp_least_query ? query_at[i] : warp_least_query;
        warp_greatest_query = query_at[i] > warp_greatest_query ? query_at[i] : warp_greatest_query;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const unsigned least = __shfl_xor_sync(0xffffffffu, warp_least_query, offset);
        const unsigned greatest = __shfl_xor_sync(0xffffffffu, warp_greatest_query, offset);
        warp_least_query = least < warp_least_query ? least : warp_least_query;
        warp_greatest_query = greatest > warp_greatest_query ? greatest : warp_greatest_query;
    }
    const bool warp_full = __all_sync(0xffffffffu, valid[0] && valid[1]);
    const unsigned n_tiles = (n_keys + TILE_KEYS - 1) / TILE_KEYS;
    unsigned tile = next_visible(0, n_tiles, tile_keys, least_query, greatest_query, window);
    int buffer = 0;
    if (tile < n_tiles)
        load_tile(tiles, buffer, tile, keys, values, key_positions, n_keys, n_kv_heads, kv_head);
    while (tile < n_tiles) {
        const unsigned next =
            next_visible(tile + 1, n_tiles, tile_keys, least_query, greatest_query, window);
        // The next tile's copies go out before this one is multiplied; its buffer was last
        // read before the barrier that ended the previous iteration.
        if (next < n_tiles) {
            load_tile(tiles, buffer ^ 1, next, keys, values, key_positions, n_keys, n_kv_heads,
                      kv_head);
            wait_copies<1>();
        } else {
            wait_copies<0>();
        }
        __syncthreads();  // every thread's copies of this tile have landed
        if (warp_busy) {
            const unsigned short* key_tile = tiles.keys[buffer];
            const unsigned* positions = tiles.positions[buffer];
            // Scores of this warp's 16 rows against the tile's keys, fragments of 8 keys.
            float s[TILE_KEYS / 8][4];
            for (int nt = 0; nt < TILE_KEYS / 8; ++nt) {
                for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
                const unsigned short* key_row = &key_tile[(nt * 8 + g) * T::STRIDE + 2 * t];
                for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
                    D::mma(s[nt], q[kk], load_pair(key_row + kk * 16),
                           load_pair(key_row + kk * 16 + 8));
            }
            // Scores in base 2 (exp2 is one instruction), masked unless every row of the warp
            // sees every key of the tile: fragment element i holds row i / 2, column
            // nt * 8 + 2t + i % 2.
            const unsigned least_key = tile_keys[2 * tile], greatest_key = tile_keys[2 * tile + 1];
            const bool whole = warp_full && (tile + 1) * TILE_KEYS <= n_keys &&
                               greatest_key <= warp_least_query &&
                               warp_greatest_query - least_key < window;
            float tile_max[2] = {hidden, hidden};
            for (int nt = 0; nt < TILE_KEYS / 8; ++nt)
                for (int i = 0; i < 4; ++i) {
                    float score = s[nt][i] * LOG2E;
                    if (!whole) {
                        const unsigned key = positions[nt * 8 + 2 * t + (i & 1)];
                        const unsigned query = query_at[i / 2];
                        const bool sees = valid[i / 2] && key <= query && query - key < window;
                        score = sees ? score : hidden;
                    }
                    s[nt][i] = score;
                    tile_max[i / 2] = fmaxf(tile_max[i / 2], score);
                }
            float shift[2], rescale[2];
            for (int r = 0; r < 2; ++r) {
                const float maximum = fmaxf(running_max[r], row_max(tile_max[r]));
                // A row that has seen nothing yet keeps -infinity; shifting by 0 then gives
                // exp2(-inf) = 0 everywhere instead of NaN.
                shift[r] = maximum == hidden ? 0.0f : maximum;
                rescale[r] = exp2_approx(running_max[r] - shift[r]);
                running_max[r] = maximum;
                running_sum[r] *= rescale[r];
            }
            for (int dt = 0; dt < HEAD_DIM / 8; ++dt)
                for (int i = 0; i < 4; ++i) o[dt][i] *= rescale[i / 2];
            for (int nt = 0; nt < TILE_KEYS / 8; ++nt)
                for (int i = 0; i < 4; ++i) {
                    s[nt][i] = exp2_approx(s[nt][i] - shift[i / 2]);
                    running_sum[i / 2] += s[nt][i];
                }
            // o += p v: p's fragments of 8 keys pair up into the A operand of 16 keys; each
            // ldmatrix gives the B operands of two 8-column fragments of o.
            const unsigned short* value_tile = tiles.values[buffer];
            for (int kk = 0; kk < TILE_KEYS / 16; ++kk) {
                const unsigned p[4] = {
                    D::pack(s[2 * kk][0], s[2 * kk][1]),
                    D::pack(s[2 * kk][2], s[2 * kk][3]),
                    D::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                    D::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]),
                };
                for (int dt = 0; dt < HEAD_DIM / 8; dt += 2) {
                    unsigned b[4];
                    load_transposed(b, shared_address(&value_tile[(kk * 16 + lane % 16) * T::STRIDE +
                                                                  (dt + lane / 16) * 8]));
                    D::mma(o[dt], p, b[0], b[1]);
                    D::mma(o[dt + 1], p, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // this tile's buffer may be refilled
        tile = next;
        buffer ^= 1;
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

// Tiles of 64 keys for heads of 64, of 32 for heads of 128: two buffers of keys and values
// then fit the 48 KiB of static shared memory (36.5 and 34.3 KiB). The names carry both sizes,
// so the host, which computes the tiles' position ranges, can only launch the instance whose
// tile it assumed (`flash_attention_cuda.rs`'s `INSTANCES`).
#define FLASH_ATTENTION(NAME, D, HEAD_DIM, TILE_KEYS)                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                     \
        NAME(const unsigned short* queries, const unsigned short* keys,                       \
             const unsigned short* values, float* out, const unsigned* query_positions,       \
             const unsigned* key_positions, const unsigned* block_queries,                    \
             const unsigned* tile_keys, unsigned n_queries, unsigned n_keys, unsigned n_heads, \
             unsigned n_kv_heads, unsigned window) {                                          \
        flash_attention<D, HEAD_DIM, TILE_KEYS>(queries, keys, values, out, query_positions,   \
                                                key_positions, block_queries, tile_keys,       \
                                                n_queries, n_keys, n_heads, n_kv_heads,        \
                                                window);                                       \
    }

FLASH_ATTENTION(flash_attention_f16_64x64, F16, 64, 64)
FLASH_ATTENTION(flash_attention_bf16_64x64, BF16, 64, 64)
FLASH_ATTENTION(flash_attention_f16_128x32, F16, 128, 32)
FLASH_ATTENTION(flash_attention_bf16_128x32, BF16, 128, 32)
