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
/* R16_PAIRS(u, p) (optional): the 16 int16 sums of byte pairs u * a (vpmaddubsw), and R16_WIDEN
 * their pair sums as int32 (vpmaddwd by ones). Where the includer defines them, the nibble formats
 * add the pairs of several dots in int16 and widen once, one multiply instead of two per dot:
 * exact, as a pair is at most 2 * 15 * 128 = 3840 for the 4-bit quants (8 dots sum to 30720) and
 * 2 * 31 * 128 = 7936 for the 5-bit ones (4 dots: 31744), both under 32767 for any int8 a. */
#ifdef R16_PAIRS
#define R16_HAS_PAIRS 1
#else
#define R16_HAS_PAIRS 0
#define R16_PAIRS(u, p) _mm256_setzero_si256()
#define R16_WIDEN(p) _mm256_setzero_si256()
#endif

AI __m256i bits_to_bytes(uint32_t bits) {
    /* byte i of the result is 0xFF where bit i is set */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), sel);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* A block of a 16-row record group (formats.h): prefetch 8 blocks ahead, and the half's scales
 * dw and the per-row term mw of the block's acc = fma(float(dot), dw * dx, acc) + mw * s. */
AI void r16_block_scales(int RT, const char *blk, int half, __m256 *dw, __m256 *mw) {
    const size_t rb = pd_r16_bytes(RT);
#pragma GCC unroll 9
    for (size_t off = 0; off < rb; off += 64) _mm_prefetch(blk + 8 * rb + off, _MM_HINT_T0);
    *dw = RT == PD_MXFP4_R16 ? load_e8(blk + 8 * half) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * half)));
    *mw = pd_r16_has_min(RT) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + pd_r16_m_off(RT) + 16 * half)))
                             : _mm256_mul_ps(*dw, _mm256_set1_ps((float)-pd_r16_offset(RT)));
}
AI __m256 r16_accumulate(__m256 acc, __m256i dot, __m256 dw, __m256 mw, const pd_q8 *xb) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), acc);
    return _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), acc);
}

AI void tile_r16_half(int RT, int C, int nb, const char *w, int half, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = pd_r16_bytes(RT);
    const __m256i lo4 = _mm256_set1_epi8(0x0f), five = _mm256_set1_epi8(0x10);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * rb;
        __m256 dw, mw;
        r16_block_scales(RT, blk, half, &dw, &mw);
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
            if (pd_r16_codebook(RT)) {   /* the codebook formats: u = codebook[nibble] + 128 */
#pragma GCC unroll 8
                for (int h = 0; h < 8; h++) u[h] = _mm256_shuffle_epi8(r16_codebook256(RT), u[h]);
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
            if (RT == PD_Q8_0_R16 || pd_r16_codebook(RT)) {   /* unsigned bytes up to 255 */
                s0 = R16_DOT_Q8(R16_Q8_SEED(xb), u[0], xb->qs);
                s1 = R16_DOT_Q8(_mm256_setzero_si256(), u[4], xb->qs + 16);
#pragma GCC unroll 3
                for (int g = 1; g < 4; g++) {
                    s0 = R16_DOT_Q8(s0, u[g], xb->qs + 4 * g);
                    s1 = R16_DOT_Q8(s1, u[g + 4], xb->qs + 16 + 4 * g);
                }
            } else if (R16_HAS_PAIRS) {
                /* int16 sums of the vpmaddubsw pairs, widened once (R16_PAIRS, see the top) */
                __m256i p0 = R16_PAIRS(u[0], xb->qs), p1 = R16_PAIRS(u[4], xb->qs + 16);
#pragma GCC unroll 3
                for (int g = 1; g < 4; g++) {
                    p0 = _mm256_add_epi16(p0, R16_PAIRS(u[g], xb->qs + 4 * g));
                    p1 = _mm256_add_epi16(p1, R16_PAIRS(u[g + 4], xb->qs + 16 + 4 * g));
                    /* (an empty asm ties each sum to its register in this order: left alone, gcc
                     * computes all the products first and spills them) */
                    __asm__("" : "+x"(p0), "+x"(p1));
                }
                if (pd_r16_has_hmask(RT)) {
                    s0 = R16_WIDEN(p0);
                    s1 = R16_WIDEN(p1);
                } else {
                    s0 = R16_WIDEN(_mm256_add_epi16(p0, p1));
                    s1 = _mm256_setzero_si256();
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
            acc[c] = r16_accumulate(acc[c], _mm256_add_epi32(s0, s1), dw, mw, xb);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm256_storeu_ps(y + c * ys + 8 * half, acc[c]);
}

#if R16_HAS_PAIRS
/* Q8_0 (and the codebook formats, whose u = codebook + 128 is looked up from the record's nibbles
 * first) where R16_PAIRS is defined (AVX2): u = w + 128 does not fit vpmaddubsw's signed pair sum
 * (2 * 255 * 127 > 32767), so each unsigned byte is split into nibbles, u = 16 hi + lo, each
 * nibble's dots summed in int16 over the block's 8 registers as the 4-bit formats do and widened
 * once: sum(u * a) = sum(lo * a) + 16 sum(hi * a), exactly the integer of the other tables. One
 * register of weights at a time, the columns inner, so the int16 sums of 4 columns stay in
 * registers. Against the sign trick (abs, sign, vpmaddubsw, vpmaddwd and the seed per dot and
 * column) this is two vpmaddubsw and two vpaddw per dot and column. */
AI void tile_r16_q8_half(int RT, int C, int nb, const char *w, int half, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = pd_r16_bytes(RT);
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * rb;
        __m256 dw, mw;
        r16_block_scales(RT, blk, half, &dw, &mw);
        const char *qs = blk + pd_r16_qs_off(RT) + 32 * half;
        __m256i pl[4], ph[4];
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) {
            __m256i v;
            if (pd_r16_codebook(RT)) {   /* register h: the low (h < 4) or high nibbles of qs register h % 4 */
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * (h & 3)));
                v = _mm256_shuffle_epi8(r16_codebook256(RT), _mm256_and_si256(h < 4 ? raw : _mm256_srli_epi16(raw, 4), lo4));
            } else {
                v = _mm256_loadu_si256((const __m256i *)(qs + 64 * h));
            }
            const __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
                const __m256i tl = R16_PAIRS(lo, xb->qs + 4 * h), th = R16_PAIRS(hi, xb->qs + 4 * h);
                pl[c] = h ? _mm256_add_epi16(pl[c], tl) : tl;
                ph[c] = h ? _mm256_add_epi16(ph[c], th) : th;
                __asm__("" : "+x"(pl[c]), "+x"(ph[c]));   /* (as in tile_r16_half) */
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            const __m256i s = _mm256_add_epi32(R16_WIDEN(pl[c]), _mm256_madd_epi16(ph[c], _mm256_set1_epi16(16)));
            acc[c] = r16_accumulate(acc[c], s, dw, mw, xb);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm256_storeu_ps(y + c * ys + 8 * half, acc[c]);
}
/* (decode, one column: the sign trick is shorter there) */
#define R16_TILE(RT, C, ...) \
    (((RT) == PD_Q8_0_R16 || pd_r16_codebook(RT)) && (C) > 1 ? tile_r16_q8_half(RT, C, __VA_ARGS__) \
                                                             : tile_r16_half(RT, C, __VA_ARGS__))
#else
#define R16_TILE(RT, C, ...) tile_r16_half(RT, C, __VA_ARGS__)
#endif

#define R16_HALF(C, half, g, xc, yc) R16_TILE(RT, C, nb, g, half, xc, xs, yc, ys)
AI void matmul_r16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                   float *y, size_t ys) {
    const int nb = k / PD_QK;
    RUN_R16_TILES(2, R16_HALF)
}

PD_R16_MATMULS   /* the table's entry points over matmul_r16 (kernels/x86/common.h) */
PD_R16_MATMUL(matmul_iq4_nl_r16, PD_IQ4_NL_R16)   /* the codebook formats' records */
PD_R16_MATMUL(matmul_mxfp4_r16, PD_MXFP4_R16)
#endif
