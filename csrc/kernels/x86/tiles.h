/* The matmul of each block format, written once over an ISA file's tile functions.
 *
 * An ISA file defines its tiles, then names the matmuls it wants:
 *     AI void tile_q(int T, int R, int C, int nb, w, ws, x, xs, y, ys)  legacy formats x pd_q8
 *     AI void tile_k(int T, int R, int C, int nb, w, ws, x, xs, y, ys)  K-quants x pd_q8k
 *     PD_Q_MATMUL(matmul_q4_0, T_Q4_0) ...  or all five at once: PD_Q_MATMULS
 *     PD_K_MATMULS                          matmul_q2_k .. matmul_q6_k
 *     PD_IQ4_MATMULS                        matmul_iq4_nl, matmul_mxfp4 (tile_q), matmul_iq4_xs (tile_k)
 * A tile computes R rows (4, or 1) x C columns (up to QCMAX / KCMAX) from nb blocks; RUN_TILES
 * (common.h) lays the tiles over the whole output, so each row's result is computed the same
 * way whatever tile it falls in. */
#ifndef PD_X86_TILES_H
#define PD_X86_TILES_H

#define PD_TILE_AT(fn, T, R_, C_, r, c)                                                       \
    fn(T, R_, C_, nb, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs,        \
       y + (c) * ys + (r), ys)
/* RUN_TILES wants a tile macro of (R, C, r, c) alone: one per format. */
#define PD_QT_T_Q4_0(R_, C_, r, c) PD_TILE_AT(tile_q, T_Q4_0, R_, C_, r, c)
#define PD_QT_T_Q4_1(R_, C_, r, c) PD_TILE_AT(tile_q, T_Q4_1, R_, C_, r, c)
#define PD_QT_T_Q5_0(R_, C_, r, c) PD_TILE_AT(tile_q, T_Q5_0, R_, C_, r, c)
#define PD_QT_T_Q5_1(R_, C_, r, c) PD_TILE_AT(tile_q, T_Q5_1, R_, C_, r, c)
#define PD_QT_T_Q8_0(R_, C_, r, c) PD_TILE_AT(tile_q, T_Q8_0, R_, C_, r, c)
#define PD_QT_T_IQ4_NL(R_, C_, r, c) PD_TILE_AT(tile_q, T_IQ4_NL, R_, C_, r, c)
#define PD_QT_T_MXFP4(R_, C_, r, c) PD_TILE_AT(tile_q, T_MXFP4, R_, C_, r, c)
#define PD_KT_T_IQ4_XS(R_, C_, r, c) PD_TILE_AT(tile_k, T_IQ4_XS, R_, C_, r, c)
#define PD_KT_T_Q2_K(R_, C_, r, c) PD_TILE_AT(tile_k, T_Q2_K, R_, C_, r, c)
#define PD_KT_T_Q3_K(R_, C_, r, c) PD_TILE_AT(tile_k, T_Q3_K, R_, C_, r, c)
#define PD_KT_T_Q4_K(R_, C_, r, c) PD_TILE_AT(tile_k, T_Q4_K, R_, C_, r, c)
#define PD_KT_T_Q5_K(R_, C_, r, c) PD_TILE_AT(tile_k, T_Q5_K, R_, C_, r, c)
#define PD_KT_T_Q6_K(R_, C_, r, c) PD_TILE_AT(tile_k, T_Q6_K, R_, C_, r, c)

#define PD_TILED_MATMUL(name, block_values, cmax, TILE)                                       \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,  \
                     int ncols, float *y, size_t ys) {                                       \
        const int nb = k / (block_values);                                                    \
        RUN_TILES(cmax, TILE)                                                                 \
    }
#define PD_Q_MATMUL(name, T) PD_TILED_MATMUL(name, PD_QK, QCMAX, PD_QT_##T)
#define PD_K_MATMUL(name, T) PD_TILED_MATMUL(name, PD_QKK, KCMAX, PD_KT_##T)
#define PD_Q_MATMULS                                                                          \
    PD_Q_MATMUL(matmul_q4_0, T_Q4_0) PD_Q_MATMUL(matmul_q4_1, T_Q4_1)                         \
    PD_Q_MATMUL(matmul_q5_0, T_Q5_0) PD_Q_MATMUL(matmul_q5_1, T_Q5_1)                         \
    PD_Q_MATMUL(matmul_q8_0, T_Q8_0)
/* The codebook formats (formats.h), over the same tiles. */
#define PD_IQ4_MATMULS                                                                        \
    PD_Q_MATMUL(matmul_iq4_nl, T_IQ4_NL) PD_Q_MATMUL(matmul_mxfp4, T_MXFP4)                   \
    PD_K_MATMUL(matmul_iq4_xs, T_IQ4_XS)
#define PD_K_MATMULS                                                                          \
    PD_K_MATMUL(matmul_q2_k, T_Q2_K) PD_K_MATMUL(matmul_q3_k, T_Q3_K)                         \
    PD_K_MATMUL(matmul_q4_k, T_Q4_K) PD_K_MATMUL(matmul_q5_k, T_Q5_K)                         \
    PD_K_MATMUL(matmul_q6_k, T_Q6_K)
#endif
