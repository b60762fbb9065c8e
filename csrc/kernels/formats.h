/* The block formats: GGML's weight types (byte-exact with the GGUF file), our repacked layouts,
 * the 8-bit activation blocks they pair with, and their traits and conversions.
 *
 * The pattern every weight format follows (as fast CPU runtimes do it): the activation vector is
 * quantized ONCE per mat-vec into 8-bit blocks (pd_q8: 32 int8 + scale + scaled sum; pd_q8k for
 * the K-quants: 256 int8 + scale + 16 partial sums), and each weight block is combined with it
 * by an integer dot product, then one float multiply-add per block. A weight row is never
 * dequantized to floats in memory on the hot path. F32/F16/BF16 weights take float activations.
 */
#ifndef PD_FORMATS_H
#define PD_FORMATS_H
#include <stddef.h>
#include <stdint.h>

/* Weight types use GGML's type ids so a GGUF tensor's type maps 1:1. */
enum {
    PD_F32 = 0, PD_F16 = 1, PD_Q4_0 = 2, PD_Q4_1 = 3, PD_Q5_0 = 6, PD_Q5_1 = 7,
    PD_Q8_0 = 8, PD_Q8_1 = 9, PD_Q2_K = 10, PD_Q3_K = 11, PD_Q4_K = 12, PD_Q5_K = 13,
    PD_Q6_K = 14, PD_Q8_K = 15, PD_IQ4_NL = 20, PD_IQ4_XS = 23, PD_BF16 = 30, PD_MXFP4 = 39,
    /* Our own layouts, built at load (pd_repack), never read from a file: ids past GGML's. */
    PD_FIRST_REPACKED = 48, PD_Q4_0_R16 = 48, PD_Q4_1_R16 = 49, PD_Q5_0_R16 = 50, PD_Q5_1_R16 = 51,
    PD_Q8_0_R16 = 52, PD_Q4_K_R16 = 53, PD_Q6_K_R16 = 54, PD_IQ4_NL_R16 = 55, PD_MXFP4_R16 = 56, PD_NTYPES = 57
};

/* Activation formats a weight type pairs with. */
enum { PD_ACT_NONE = -1, PD_ACT_F32 = 0, PD_ACT_Q8 = 1, PD_ACT_Q8K = 2 };

#define PD_QK 32          /* values per block of the legacy formats and of pd_q8 */

/* Quantized activation block: x[i] ~= d * qs[i]; s = d * sum(qs) feeds the minimum term of
 * formats like Q4_1 (w = dw*q + m  =>  sum(w*x) = dw*dx*sum(q*qs) + m*s). */
typedef struct { float d; float s; int8_t qs[PD_QK]; } pd_q8;

#define PD_QKK 256        /* values per super-block of the K-quants and of pd_q8k */

/* Activation block for the K-quants: 256 values, one scale, and the sum of each 16 values so the
 * minimum term of Q2_K/Q4_K/Q5_K (w = d*sc*q - dmin*m per 16 or 32 values) and the offsets of
 * Q3_K/Q6_K need no extra pass: sum(w*x) = d*dx*sum(sc*sum(q*qs)) - dmin*dx*sum(m*bsums). */
typedef struct { float d; int8_t qs[PD_QKK]; int16_t bsums[PD_QKK / 16]; } pd_q8k;
/* Both quantizers: d = amax/127 (float32, >= 0), q = round-half-away(x * (1/d)) (|q| <= 127),
 * the rule of gguf's Q8_0 quantizer. (ggml's own quantize_row_q8_K divides by the signed max
 * and rounds half to even; same precision, but one rule for both formats is simpler to test.) */
/* A block holding a NaN or an infinity (a hostile or broken model: finite weights and inputs
 * never make one) has no scale: it quantizes to d = s = NaN and all-zero quants, so every dot
 * with it is NaN, the same in every kernel table. (Converting the non-finite x * (1/d) to int
 * would give INT_MIN, undefined to sum.) amax is the largest |x| compared as integers (the bits
 * of |x|): the float max for finite values, and a NaN's bits exceed every other, so a NaN
 * anywhere in the block shows, where float max instructions and fmaxf drop it. */
static inline uint32_t pd_abs_bits(float x) {
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}
static inline float pd_bits_float(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline int pd_amax_finite(float amax) { return amax <= 3.40282347e+38f; }   /* false for NaN */
static inline void pd_q8_nonfinite(pd_q8 *y) {
    y->d = y->s = __builtin_nanf("");
    for (int j = 0; j < PD_QK; j++) y->qs[j] = 0;
}
static inline void pd_q8k_nonfinite(pd_q8k *y) {
    y->d = __builtin_nanf("");
    for (int j = 0; j < PD_QKK; j++) y->qs[j] = 0;
    for (int j = 0; j < PD_QKK / 16; j++) y->bsums[j] = 0;
}

/* GGML block layouts (byte-exact with the GGUF file). f16 stored as uint16_t bits. */
typedef struct { uint16_t d; uint8_t qs[16]; } pd_block_q4_0;               /* w = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[16]; } pd_block_q4_1;            /* w = d*q + m */
typedef struct { uint16_t d; int8_t qs[32]; } pd_block_q8_0;                /* w = d*q */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } pd_block_q5_0;   /* w = d*(q-16) */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } pd_block_q5_1; /* w = d*q + m */
/* nibble layout of q4_0/q4_1: value j (j<16) is qs[j] & 0xF, value j+16 is qs[j] >> 4;
 * q5_0/q5_1 add a fifth bit: bit j of the little-endian 32-bit word qh is bit 4 of value j. */

/* The codebook formats: 4-bit indices into a 16-entry int8 table, the table lookup a byte
 * shuffle in the SIMD kernels (vpshufb / TBL), then the int8 dots of Q8_0 (pd_q8 activations)
 * or of the K-quants (IQ4_XS: pd_q8k). Nibble layout of each 32 values as q4_0's: value j (j < 16)
 * is qs[j] & 0xF, value j + 16 is qs[j] >> 4.
 *   IQ4_NL: w = d * pd_kvalues_iq4nl[nibble]                        (d f16; 18 bytes per 32)
 *   MXFP4:  w = 2^(e - 128) * pd_kvalues_mxfp4[nibble]   (e an E8M0 byte; 17 bytes per 32): the
 *           table holds the e2m1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives,
 *           times 2), so the scale is the E8M0 value 2^(e - 127) halved (pd_e8m0_half)
 *   IQ4_XS: super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales ls (low 4 bits the nibble
 *           ib % 2 of scales_l[ib / 2], high 2 bits bits 2ib..2ib+1 of scales_h), stored + 32:
 *           w = d * (ls - 32) * pd_kvalues_iq4nl[nibble]; sub-block ib's nibbles are qs[16ib..16ib+15]
 *           (136 bytes per 256). As a K-quant (pd_unpack_kblock): sc = ls - 32 for both halves of
 *           a sub-block, no minimum. */
typedef struct { uint16_t d; uint8_t qs[16]; } pd_block_iq4_nl;
typedef struct { uint8_t e; uint8_t qs[16]; } pd_block_mxfp4;
typedef struct { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } pd_block_iq4_xs;
static const int8_t pd_kvalues_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10,   /* (negative: */
                                             1, 13, 25, 38, 53, 69, 89, 113 };          /* indices 0..7) */
static const int8_t pd_kvalues_mxfp4[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
/* 2^(e - 128) as a float (exact for every e: e < 2 are the subnormals 2^-128, 2^-127). */
static inline float pd_e8m0_half(uint8_t e) {
    return pd_bits_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}
/* Sub-block ib's 6-bit scale of an IQ4_XS super-block, minus 32 (-32..31). */
static inline int pd_iq4xs_scale(const pd_block_iq4_xs *b, int ib) {
    return (((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | ((b->scales_h >> 2 * ib) & 3) << 4) - 32;
}
/* All 8 stored scales ls (0..63) of an IQ4_XS super-block as the bytes of a word, byte ib for
 * sub-block ib (for SIMD: no per-sub-block shifts): scales_l's nibbles and scales_h's bit pairs
 * spread to one byte each by the usual interleaving shifts. */
static inline uint64_t pd_iq4xs_scales_u8(const pd_block_iq4_xs *b) {
    uint32_t l;
    __builtin_memcpy(&l, b->scales_l, 4);
    uint64_t lo = l, hi = b->scales_h;
    lo = (lo | lo << 16) & 0x0000ffff0000ffffull;
    lo = (lo | lo << 8) & 0x00ff00ff00ff00ffull;
    lo = (lo | lo << 4) & 0x0f0f0f0f0f0f0f0full;    /* nibble ib -> byte ib */
    hi = (hi | hi << 24) & 0x000000ff000000ffull;
    hi = (hi | hi << 12) & 0x000f000f000f000full;
    hi = (hi | hi << 6) & 0x0303030303030303ull;    /* bit pair ib -> byte ib */
    return lo | hi << 4;
}
_Static_assert(sizeof(pd_block_iq4_nl) == 18 && sizeof(pd_block_mxfp4) == 17 && sizeof(pd_block_iq4_xs) == 136,
               "codebook format structs must match GGML's byte layout");

/* The legacy formats repacked by 16 rows (PD_*_R16, built at load by pd_repack): block b of
 * rows 16i..16i+15 in one record of exactly the bytes of their 16 file blocks, interleaved so
 * that one 512-bit register holds 4 quant bytes of each of the 16 rows. Record layout:
 *     uint16 d[16]            the rows' f16 scales
 *     uint16 m[16]            f16 minima (Q4_1, Q5_1 only)
 *     uint64 hmask[8]         fifth bits (Q5_0, Q5_1 only): bit 4j+t of hmask[h] is bit 4h+t of row j's qh
 *     uint8  qs[256 or 512]   nibble formats: qs[64g + 4j + t] = row j's qs[4g + t] (g < 4), whose
 *                             low nibble is value 4g+t and high nibble value 16+4g+t;
 *                             Q8_0: qs[64h + 4j + t] = row j's qs[4h + t] ^ 0x80 (h < 8: w + 128)
 * Unpacked, register h (h < 8) holds the unsigned quants u of values 4h..4h+3 of every row
 * (nibble formats: h < 4 the low nibbles of qs register h, h >= 4 the high ones of h - 4; plus
 * 16 where the fifth bit is set), which pair with activation bytes 4h..4h+3 broadcast to all
 * lanes: 8 vpdpbusd give a block's integer dot sum(u * a) for 16 rows and one column. Then
 * per block, for all 16 rows at once:
 *     acc = fma(float(sum(u * a)), d * dx, acc);  acc = fma(mw, s, acc)
 * with mw = m (Q4_1, Q5_1) or -offset * d (Q4_0: 8, Q5_0: 16, Q8_0: 128) and s = dx * sum(a):
 * the offset leaves as a float term, not an integer one, within the kernels' float tolerance.
 * The codebook formats (the x86 tables, whose R16 tiles look the codebook up by a byte shuffle; ARM
 * keeps their file layout): their nibbles are indices, u = codebook[nibble] + 128, offset 128 (as Q8_0's).
 *     PD_IQ4_NL_R16: Q4_0's record;  PD_MXFP4_R16: uint8 e[16] (the rows' E8M0 bytes), then qs[256]
 *     (272 bytes: 16 file blocks exactly), d = pd_e8m0_half(e).
 * Against the file's layout, which needs per row a convert, a scale permute and an fma per
 * 64 values, this is 8 integer and 3 float instructions per 32 values for 16 rows. */
enum { PD_R16_ROWS = 16 };
#define PD_REPACK_ROWS PD_R16_ROWS
static inline int pd_r16_file_type(int rt) {
    return rt == PD_Q4_0_R16 ? PD_Q4_0 : rt == PD_Q4_1_R16 ? PD_Q4_1 : rt == PD_Q5_0_R16 ? PD_Q5_0
         : rt == PD_Q5_1_R16 ? PD_Q5_1 : rt == PD_Q8_0_R16 ? PD_Q8_0 : rt == PD_IQ4_NL_R16 ? PD_IQ4_NL
         : rt == PD_MXFP4_R16 ? PD_MXFP4 : -1;
}
/* The codebook of a repacked codebook format (NULL for the others). */
static inline const int8_t *pd_r16_codebook(int rt) {
    return rt == PD_IQ4_NL_R16 ? pd_kvalues_iq4nl : rt == PD_MXFP4_R16 ? pd_kvalues_mxfp4 : NULL;
}
static inline int pd_r16_has_min(int rt) { return rt == PD_Q4_1_R16 || rt == PD_Q5_1_R16; }
static inline int pd_r16_has_hmask(int rt) { return rt == PD_Q5_0_R16 || rt == PD_Q5_1_R16; }
static inline int pd_r16_offset(int rt) {
    return rt == PD_Q4_0_R16 ? 8 : rt == PD_Q5_0_R16 ? 16 : rt == PD_Q8_0_R16 || pd_r16_codebook(rt) ? 128 : 0;
}
static inline size_t pd_r16_m_off(int rt) { (void)rt; return 32; }
static inline size_t pd_r16_hmask_off(int rt) { return pd_r16_has_min(rt) ? 64 : 32; }
static inline size_t pd_r16_qs_off(int rt) {
    return rt == PD_MXFP4_R16 ? 16 : 32 + (pd_r16_has_min(rt) ? 32 : 0) + (pd_r16_has_hmask(rt) ? 64 : 0);
}
static inline size_t pd_r16_bytes(int rt) { return pd_r16_qs_off(rt) + (rt == PD_Q8_0_R16 ? 512 : 256); }
/* The repacked type of a file type (-1: none), and the repacking of nrows (a multiple of
 * PD_R16_ROWS) rows of k values from the file's layout (row stride src_stride) to dst. */
int pd_repacked_type(int type);
int pd_repack(int type, const void *src, size_t src_stride, int nrows, int k, void *dst);
/* The plain-C twin of the SIMD kernels of the repacked types, x86 and ARM64 (tests compare them bit for
 * bit; no scalar table uses it, as the file's layout is as fast there). rt: a PD_*_R16. */
void pd_scalar_matmul_r16(int rt, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                          int ncols, float *y, size_t ys);

/* K-quants: super-blocks of 256 values split into 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 8
 * of 32 (Q4_K, Q5_K); each sub-block has a small integer scale (and for Q2_K/Q4_K/Q5_K a
 * minimum) that one f16 per super-block scales. In all five, value i of the super-block is
 *     w_i = d * sc[s] * q_i - dmin * m[s]           (s = the sub-block of i; no m: Q3_K, Q6_K)
 * with integer q_i, sc, m, so a dot with pd_q8k activations (x_i = dx * a_i) is
 *     dx * (d * sum_s sc[s] * sum_{i in s} q_i a_i  -  dmin * sum_s m[s] * sum_{i in s} a_i),
 * all integer inside the parentheses; the inner sums of a_i are pd_q8k's bsums.
 * Layouts as GGML's block_q*_K. "Chunk" t below = values 32t..32t+31 (t < 8). */

/* Q2_K: q 2 bits (0..3), 16 sub-blocks of 16; scales[s] = sc (low nibble) | m << 4.
 * q of value i = 128h + 32g + l (h < 2, g < 4, l < 32) is (qs[32h + l] >> 2g) & 3. */
typedef struct {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d, dmin;
} pd_block_q2_k;                                                            /* 84 bytes */

/* Q3_K: q 3 bits, stored offset: q = low2 + 4*hbit - 4 (-4..3); sc 6 bits, stored + 32
 * (sc = raw - 32: -32..31); 16 sub-blocks of 16; no minimum.
 * low2 of value i = 128h + 32g + l as in Q2_K; hbit is bit (i / 32) of hmask[i % 32].
 * Raw scale s: low 4 bits in scales[s % 8] (low nibble if s < 8, else high), high 2 bits in
 * scales[8 + s % 4] at bits 2*(s / 4). */
typedef struct {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
} pd_block_q3_k;                                                            /* 110 bytes */

/* Q4_K: q 4 bits (0..15), 8 sub-blocks of 32 with 6-bit sc and m (pd_unpack_scales_k4).
 * Chunk pair p (values 64p..64p+63): qs[32p + l] & 0xF is value 64p + l (sub-block 2p),
 * qs[32p + l] >> 4 is value 64p + 32 + l (sub-block 2p + 1). */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} pd_block_q4_k;                                                            /* 144 bytes */

/* Q5_K: Q4_K plus a fifth bit: bit 4 of value i is bit (i / 32) of qh[i % 32] (q: 0..31). */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} pd_block_q5_k;                                                            /* 176 bytes */

/* Q6_K: q 6 bits, stored + 32 (q = raw - 32: -32..31); sc int8; 16 sub-blocks of 16.
 * Value i = 128h + 32g + l: low 4 bits are ql[64h + l + 32*(g & 1)], low nibble if g < 2
 * else high; high 2 bits are (qh[32h + l] >> 2g) & 3. */
typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} pd_block_q6_k;                                                            /* 210 bytes */

/* Q4_K and Q6_K repacked by 16 rows (PD_Q4_K_R16, PD_Q6_K_R16, built at load by pd_repack):
 * super-block b of rows 16i..16i+15 in one record of exactly the bytes of their 16 file blocks.
 * As in the legacy R16 layouts, a 64-byte register holds 4 bytes of each of the 16 rows (row j
 * at bytes 4j..4j+3, one 32-bit lane per row), so a vpdpbusd against 4 activation bytes
 * broadcast to every lane gives 16 rows' 4-value dots, and every scale applies per lane: the
 * sub-block scales are extracted lane-wise by shifts and masks (never a cross-lane shuffle), and
 * the super-block's float step d*isum - dmin*msum is done for 16 rows at once.
 *
 * PD_Q4_K_R16 (2304 bytes):
 *     uint8  qs[2048]   qs[64(8p + t) + 4j + i] = row j's qs[32p + 4t + i] (p < 4, t < 8): low
 *                       nibble value 64p + 4t + i (sub-block 2p), high nibble 32 values later
 *                       (sub-block 2p + 1)
 *     uint16 d[16], dmin[16]
 *     uint8  scales[192] scales[64w + 4j + i] = row j's scales[4w + i] (w < 3): the file's 6-bit
 *                       packing, unpacked for 16 rows by pd_unpack_scales_k4's word arithmetic
 * PD_Q6_K_R16 (3360 bytes): with q(n) row j's 6-bit stored value n (0..63), lo = q & 15, hi = q >> 4
 *     uint8  qs[3072]   3 registers per group v < 16: the 4 values 4v + i + 64Q of each quarter
 *                       Q < 4 (n0..n3 below) as bytes 4j + i of
 *                         R1 = lo(n0) | hi(n0) << 4 | hi(n2) << 6     at qs + 64(3v)
 *                         R2 = lo(n1) | hi(n1) << 4 | hi(n3) << 6     at qs + 64(3v + 1)
 *                         R3 = lo(n2) | lo(n3) << 4                   at qs + 64(3v + 2)
 *                       so u0 = R1 & 63, u1 = R2 & 63, u2 = (R3 & 15) | (R1 >> 2 & 48),
 *                       u3 = (R3 >> 4 & 15) | (R2 >> 2 & 48): 9 operations per 4 registers
 *     uint16 d[16]
 *     int8   sc[256]    sc[32t + 2j + e] = row j's scales[2t + e] (t < 8): sign-extended to int16,
 *                       lane j holds the pair (sc[2t], sc[2t+1]), which pairs with pd_q8k's
 *                       (bsums[2t], bsums[2t+1]) in one vpdpwssd for the stored offset 32
 * The kernels compute each super-block's integers isum = sum_s sc[s] * dot_s and msum exactly,
 * then x.d * (d * isum - dmin * msum) as the scalar table does: the results are bit-identical
 * to the scalar kernels on the file's layout (pd_scalar_matmul_kr16 is the twin of the layout). */
enum { PD_KR16_Q4K_BYTES = 2304, PD_KR16_Q6K_BYTES = 3360 };
static inline int pd_is_kr16(int rt) { return rt == PD_Q4_K_R16 || rt == PD_Q6_K_R16; }
void pd_repack_kr16(int type, const void *src, size_t src_stride, int nrows, int k, void *dst);
void pd_scalar_matmul_kr16(int rt, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                           int ncols, float *y, size_t ys);

/* The 12 scale bytes of Q4_K/Q5_K -> 8 sc and 8 m of 6 bits: sub-blocks 0..3 keep theirs in
 * the low 6 bits of bytes 0..3 (sc) and 4..7 (m); sub-blocks 4..7 have their low 4 bits in the
 * nibbles of bytes 8..11 (sc low, m high) and their top 2 bits in the top bits of bytes 0..7.
 * Done on 32-bit words, 4 sub-blocks at a time. out[0..7] = sc, out[8..15] = m. */
static inline void pd_unpack_scales_k4(const uint8_t *s, uint8_t out[16]) {
    uint32_t a0, a1, a2, o[4];
    __builtin_memcpy(&a0, s, 4); __builtin_memcpy(&a1, s + 4, 4); __builtin_memcpy(&a2, s + 8, 4);
    o[0] = a0 & 0x3f3f3f3fu;                                               /* sc 0..3 */
    o[1] = (a2 & 0x0f0f0f0fu) | ((a0 >> 6) & 0x03030303u) << 4;           /* sc 4..7 */
    o[2] = a1 & 0x3f3f3f3fu;                                               /* m 0..3 */
    o[3] = ((a2 >> 4) & 0x0f0f0f0fu) | ((a1 >> 6) & 0x03030303u) << 4;    /* m 4..7 */
    __builtin_memcpy(out, o, 16);
}

/* The 12 scale bytes of Q3_K -> 16 signed scales (raw - 32), 4 at a time on 32-bit words. */
static inline void pd_unpack_scales_q3k(const uint8_t *s, int8_t out[16]) {
    uint32_t a0, a1, a2, o[4];
    __builtin_memcpy(&a0, s, 4); __builtin_memcpy(&a1, s + 4, 4); __builtin_memcpy(&a2, s + 8, 4);
    o[0] = (a0 & 0x0f0f0f0fu) | (a2 & 0x03030303u) << 4;                   /* 0..3 */
    o[1] = (a1 & 0x0f0f0f0fu) | ((a2 >> 2) & 0x03030303u) << 4;            /* 4..7 */
    o[2] = ((a0 >> 4) & 0x0f0f0f0fu) | ((a2 >> 4) & 0x03030303u) << 4;     /* 8..11 */
    o[3] = ((a1 >> 4) & 0x0f0f0f0fu) | ((a2 >> 6) & 0x03030303u) << 4;     /* 12..15 */
    __builtin_memcpy(out, o, 16);
    for (int j = 0; j < 16; j++) out[j] = (int8_t)(out[j] - 32);
}

/* One K-quant super-block in the common form above: w_i = (d * sc[i/16]) * q[i] - dmin *
 * m[i/16] (Q4_K/Q5_K repeat each 32-value sub-block's sc/m for both halves; dmin = 0 and
 * m = 0 for Q3_K/Q6_K/IQ4_XS). Used by the scalar kernels and pd_dequantize_row. type: PD_Q2_K..PD_Q6_K,
 * PD_IQ4_XS. */
typedef struct { float d, dmin; int8_t q[256]; int16_t sc[16], m[16]; } pd_kblock;
void pd_unpack_kblock(int type, const void *blk, pd_kblock *out);

_Static_assert(sizeof(pd_q8k) == 292 && sizeof(pd_block_q2_k) == 84 &&
               sizeof(pd_block_q3_k) == 110 && sizeof(pd_block_q4_k) == 144 &&
               sizeof(pd_block_q5_k) == 176 && sizeof(pd_block_q6_k) == 210,
               "K-quant structs must match GGML's byte layout");

/* Type traits (kernels/quant.c). */
int pd_type_block_size(int type);      /* values per block, 0 if unknown */
size_t pd_type_block_bytes(int type);  /* bytes per block */
int pd_type_act_format(int type);      /* PD_ACT_* */
const char *pd_type_name(int type);
/* Dequantize one row (embedding lookup; tests). Returns 0, or -1 for unsupported type. */
int pd_dequantize_row(int type, const void *w, float *y, int k);


/* Portable scalar f16/bf16 conversions. */
float pd_f16_to_f32(uint16_t h);
uint16_t pd_f32_to_f16(float f);
/* pd_f16_to_f32's body, inlinable in portable hot loops (the scalar kernels). */
static inline float pd_f16_to_f32_inline(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) {                  /* inf / nan: keep the payload bits */
        v.u = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {              /* zero / subnormal: mant * 2^-24 is exact in f32 */
        v.f = (float)mant * (1.0f / 16777216.0f);
        v.u |= sign;
    } else {
        v.u = sign | ((exp + 112) << 23) | (mant << 13);   /* rebias 15 -> 127 */
    }
    return v.f;
}
static inline float pd_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
#endif
