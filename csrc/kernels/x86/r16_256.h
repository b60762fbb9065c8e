/* The legacy formats repacked by 16 rows (PD_*_R16, formats.h) with 256-bit registers, for the
 * AVX-VNNI table (x86/avxvnni.c: R16_DOT is vpdpbusd) and the AVX2 one (x86/avx2.c: vpmaddubsw +
 * vpmaddwd, exact for the nibble formats' quants <= 31; Q8_0's unsigned bytes, up to 255, would
 * saturate vpmaddubsw, so there R16_DOT_Q8 takes the signed bytes w = u ^ 0x80 with the sign
 * trick and R16_Q8_SEED adds 128 * sum(a): the same integer). The includer defines R16_DOT (and
 * R16_DOT_Q8 / R16_Q8_SEED where they differ from it / zero).
 *
 * As kernels/x86/avx512.c does them: a group's 16 rows in two passes of 8 (the low and the high
 * 32 bytes of each 64-byte record register), so the 8 unpacked registers, up to 4 column
 * accumulators and the broadcasts fit the 16 ymm registers. Each lane does exactly the AVX-512
 * kernel's arithmetic (and pd_scalar_matmul_r16's): the same bits. */
#ifndef PD_X86_R16_256_H
#define PD_X86_R16_256_H
#ifndef R16_DOT_Q8
#define R16_DOT_Q8 R16_DOT
#endif
#ifndef R16_Q8_SEED
#define R16_Q8_SEED(xb) _mm256_setzero_si256()
#endif

AI __m256i bits_to_bytes(uint32_t bits) {
    /* byte i of the result is 0xFF where bit i is set */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

AI void tile_r16_half(int RT, int C, int nb, const char *w, int half, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = pd_r16_bytes(RT);
    const __m256i lo4 = _mm256_set1_epi8(0x0f), five = _mm256_set1_epi8(0x10);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * rb;
#pragma GCC unroll 9
        for (size_t off = 0; off < rb; off += 64) _mm_prefetch(blk + 8 * rb + off, _MM_HINT_T0);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * half)));
        const __m256 mw = pd_r16_has_min(RT)
            ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + pd_r16_m_off(RT) + 16 * half)))
            : _mm256_mul_ps(dw, _mm256_set1_ps((float)-pd_r16_offset(RT)));
        const char *qs = blk + pd_r16_qs_off(RT) + 32 * half;
        __m256i u[8];
        if (RT == PD_Q8_0_R16) {
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) u[h] = _mm256_loadu_si256((const __m256i *)(qs + 64 * h));
        } else {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * g));
                u[g] = _mm256_and_si256(v, lo4);
                u[g + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            }
            if (pd_r16_has_hmask(RT)) {
                const char *hm = blk + pd_r16_hmask_off(RT) + 4 * half;
#pragma GCC unroll 8
                for (int h = 0; h < 8; h++) {
                    uint32_t bits;
                    memcpy(&bits, hm + 8 * h, 4);
                    u[h] = _mm256_add_epi8(u[h], _mm256_and_si256(bits_to_bytes(bits), five));
                }
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            __m256i s0, s1;
            if (RT == PD_Q8_0_R16) {
                s0 = R16_DOT_Q8(R16_Q8_SEED(xb), u[0], xb->qs);
                s1 = R16_DOT_Q8(_mm256_setzero_si256(), u[4], xb->qs + 16);
#pragma GCC unroll 3
                for (int g = 1; g < 4; g++) {
                    s0 = R16_DOT_Q8(s0, u[g], xb->qs + 4 * g);
                    s1 = R16_DOT_Q8(s1, u[g + 4], xb->qs + 16 + 4 * g);
                }
            } else {
                s0 = R16_DOT(_mm256_setzero_si256(), u[0], xb->qs);
                s1 = R16_DOT(_mm256_setzero_si256(), u[4], xb->qs + 16);
#pragma GCC unroll 3
                for (int g = 1; g < 4; g++) {
                    s0 = R16_DOT(s0, u[g], xb->qs + 4 * g);
                    s1 = R16_DOT(s1, u[g + 4], xb->qs + 16 + 4 * g);
                }
            }
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xb->d));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), sc, acc[c]);
            acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm256_storeu_ps(y + c * ys + 8 * half, acc[c]);
}

AI void matmul_r16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                   float *y, size_t ys) {
    const int nb = k / PD_QK;
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const char *g = (const char *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c += 4) {
            const char *xc = (const char *)x + (size_t)c * xs;
            float *yc = y + (size_t)c * ys + r;
            for (int half = 0; half < 2; half++)
                switch (ncols - c >= 4 ? 4 : ncols - c) {
                case 1: tile_r16_half(RT, 1, nb, g, half, xc, xs, yc, ys); break;
                case 2: tile_r16_half(RT, 2, nb, g, half, xc, xs, yc, ys); break;
                case 3: tile_r16_half(RT, 3, nb, g, half, xc, xs, yc, ys); break;
                default: tile_r16_half(RT, 4, nb, g, half, xc, xs, yc, ys); break;
                }
        }
    }
}

PD_R16_MATMULS   /* the table's entry points over matmul_r16 (kernels/x86/common.h) */
#endif
