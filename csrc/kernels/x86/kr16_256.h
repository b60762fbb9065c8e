/* Q4_K and Q6_K repacked by 16 rows (formats.h: PD_Q4_K_R16, PD_Q6_K_R16) with 256-bit
 * registers, for the AVX2 table (x86/avx2.c) and the AVX-VNNI one (x86/avxvnni.c), which
 * include this after defining KR_KDOT(acc, pairs, sc) (int32 acc += the int16 pairs times sc,
 * summed by twos: vpmaddwd + vpaddd, or AVX-VNNI's vpdpwssd).
 *
 * A record's 16 rows are done as two halves of 8 (the low and the high 32 bytes of each 64-byte
 * register of the record), one after the other while the record is in L1, one 32-bit lane per
 * row as in x86/avx512_kr16.c, with no vpdpbusd:
 * vpmaddubsw of the unsigned quants and the 4 broadcast activation bytes gives each row's two
 * int16 pair sums; those of a sub-block are added in int16 (Q4_K: 8 registers of quants <= 15,
 * |sum| <= 8 * 2 * 15 * 127 < 2^15; Q6_K, quants <= 63: 2 registers) and KR_KDOT multiplies them
 * by the sub-block's scale, an int16 pair (sc, sc) per lane made by one in-lane vpshufb. The
 * integers are exact, the float step the scalar table's: bit-identical to it. Where the includer
 * also defines KR_BDOT (the AVX-VNNI table: vpdpbusd), Q4_K's decode tile takes 4-byte dots
 * instead (tile2_q4k_c1_bdot). */
#ifndef PD_X86_KR16_256_H
#define PD_X86_KR16_256_H

#define KR2_CMAX 3   /* columns per pass: 16 ymm registers */
#ifndef KR2_PF
#define KR2_PF 16    /* records ahead to prefetch into L2, as x86/avx512_kr16.c (see there) */
#endif

/* The pshufb pattern putting byte k of each 32-bit lane into both int16 halves of it. */
AI __m256i kr2_pair_of_byte(int k) {
    return _mm256_set1_epi32((int)(0x80008000u | (uint32_t)k | (uint32_t)k << 16));
}
/* ... and int16 e (0, 1) of each lane into both halves. */
AI __m256i kr2_pair_of_word(int e) {
    const uint32_t b = (uint32_t)(2 * e), p = b | (b + 1) << 8;
    return _mm256_set1_epi32((int)(p | p << 16));
}
/* pshufb indexes bytes within 16-byte lanes: add the 32-bit lane's base (0, 4, 8, 12). */
AI __m256i kr2_lane_base(__m256i pat) {
    return _mm256_add_epi8(pat, _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c,
                                                  0, 0x04040404, 0x08080808, 0x0c0c0c0c));
}

AI __m256 kr2_step(__m256 acc, float xd, __m256 d, __m256i isum, __m256 dmin, __m256i msum, int has_min) {
    __m256 t = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
    if (has_min) t = _mm256_sub_ps(t, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(msum)));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(xd), t));
}

/* Keeps an accumulation a chain: gcc otherwise reassociates a record's 32 int16 adds into a tree
 * whose leaves (the vpmaddubsw products) it computes early and spills. */
#define KR2_CHAIN(v) __asm__("" : "+x"(v))
/* A compiler-only fence: loads after it are not merged with the same loads before it (gcc would
 * keep the first half's 64 x C activation broadcasts live for the second and spill them). */
#define KR2_FENCE() __asm__ volatile("" ::: "memory")

AI __m256i kr2_bcast(const void *p) { return _mm256_set1_epi32(ld32(p)); }

AI void kr2_prefetch(const char *rec, size_t rb) {   /* the record KR2_PF ahead, into L2 */
    if (KR2_PF) for (size_t off = 0; off < rb; off += 64) _mm_prefetch(rec + KR2_PF * rb + off, _MM_HINT_T1);
}

/* The 4 sub-block scales 0..3 (hi4 = 0) or 4..7 (hi4 = 1) of each of a half's 8 rows, byte i of
 * its 32-bit lane (pd_unpack_scales_k4's word arithmetic on the record's scale words). */
AI __m256i kr2_q4k_scales(const char *rec, int hb, int hi4) {
    const __m256i s0 = _mm256_loadu_si256((const __m256i *)(rec + 2112 + hb));
    if (!hi4) return _mm256_and_si256(s0, _mm256_set1_epi8(0x3f));
    const __m256i s2 = _mm256_loadu_si256((const __m256i *)(rec + 2240 + hb));
    return _mm256_or_si256(_mm256_and_si256(s2, _mm256_set1_epi8(0x0f)),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s0, 6), _mm256_set1_epi8(0x03)), 4));
}

/* The 8 sub-block minima of each of a half's 8 rows as 4 registers of int16 pairs, lane j of
 * register i holding row j's (m[i'], m[i' + 2]) for the pairs kr16_min_pairs makes of bsums. */
AI void kr2_q4k_mins(const char *rec, int hb, __m256i mp[4]) {
    const __m256i s1 = _mm256_loadu_si256((const __m256i *)(rec + 2176 + hb)),
                  s2 = _mm256_loadu_si256((const __m256i *)(rec + 2240 + hb));
    const __m256i w16 = _mm256_set1_epi32(0x00ff00ff);
    const __m256i o2 = _mm256_and_si256(s1, _mm256_set1_epi8(0x3f));
    const __m256i o3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 4), _mm256_set1_epi8(0x0f)),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(s1, 6), _mm256_set1_epi8(0x03)), 4));
    mp[0] = _mm256_and_si256(o2, w16); mp[1] = _mm256_and_si256(_mm256_srli_epi32(o2, 8), w16);
    mp[2] = _mm256_and_si256(o3, w16); mp[3] = _mm256_and_si256(_mm256_srli_epi32(o3, 8), w16);
}

AI void tile2_q4k(int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = PD_KR16_Q4K_BYTES;
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc2[2][KR2_CMAX];
#pragma GCC unroll 6
    for (int c = 0; c < 2 * C; c++) acc2[c / C][c % C] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *rec = w + (size_t)b * rb;
        kr2_prefetch(rec, rb);
#pragma GCC unroll 2
      for (int half = 0; half < 2; half++) {   /* both halves of a record while it is in L1 */
        const int hb = 32 * half;
        KR2_FENCE();   /* the halves' activation loads stay their own */
        __m256 *acc = acc2[half];
        const __m256i o0 = kr2_q4k_scales(rec, hb, 0), o1 = kr2_q4k_scales(rec, hb, 1);
        const pd_q8k *xb[KR2_CMAX];
        __m256i isum[KR2_CMAX];
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) { xb[c] = (const pd_q8k *)(x + c * xs) + b; isum[c] = _mm256_setzero_si256(); }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m256i al[KR2_CMAX], ah[KR2_CMAX];
#pragma GCC unroll 3
            for (int c = 0; c < C; c++) al[c] = ah[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * (8 * p + t) + hb));
                const __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
#pragma GCC unroll 3
                for (int c = 0; c < C; c++) {
                    al[c] = _mm256_add_epi16(al[c], _mm256_maddubs_epi16(lo, kr2_bcast(xb[c]->qs + 64 * p + 4 * t)));
                    ah[c] = _mm256_add_epi16(ah[c], _mm256_maddubs_epi16(hi, kr2_bcast(xb[c]->qs + 64 * p + 32 + 4 * t)));
                    KR2_CHAIN(al[c]); KR2_CHAIN(ah[c]);
                }
            }
            const __m256i ow = p < 2 ? o0 : o1;
            const __m256i sca = _mm256_shuffle_epi8(ow, kr2_lane_base(kr2_pair_of_byte(2 * (p & 1))));
            const __m256i scb = _mm256_shuffle_epi8(ow, kr2_lane_base(kr2_pair_of_byte(2 * (p & 1) + 1)));
#pragma GCC unroll 3
            for (int c = 0; c < C; c++) {
                isum[c] = KR_KDOT(isum[c], al[c], sca);
                isum[c] = KR_KDOT(isum[c], ah[c], scb);
            }
        }
        __m256i mp[4];
        kr2_q4k_mins(rec, hb, mp);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 2048 + 16 * half)));
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 2080 + 16 * half)));
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            int32_t bp[4];
            kr16_min_pairs(xb[c]->bsums, bp);
            __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) msum = KR_KDOT(msum, mp[i], _mm256_set1_epi32(bp[i]));
            acc[c] = kr2_step(acc[c], xb[c]->d, dv, isum[c], dmv, msum, 1);
        }
      }
    }
#pragma GCC unroll 6
    for (int c = 0; c < 2 * C; c++) _mm256_storeu_ps(y + (c % C) * ys + 8 * (c / C), acc2[c / C][c % C]);
}

/* A record's float step for one column, both halves: the minima term from bsums, then
 * kr2_step with the halves' d and dmin (the decode tiles' shared end; isum: the scaled sums). */
AI void kr2_q4k_c1_step(__m256 acc[2], const char *rec, const pd_q8k *xb, const __m256i isum[2]) {
    int32_t bp[4];
    kr16_min_pairs(xb->bsums, bp);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i mp[4];
        kr2_q4k_mins(rec, 32 * h, mp);
        __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) msum = KR_KDOT(msum, mp[i], _mm256_set1_epi32(bp[i]));
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 2048 + 16 * h)));
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 2080 + 16 * h)));
        acc[h] = kr2_step(acc[h], xb->d, dv, isum[h], dmv, msum, 1);
    }
}

/* One column (decode): both halves in one pass, each activation broadcast used by both at once.
 * (tile2_q4k does a half at a time; for one column gcc merges the two halves' 64 broadcasts per
 * record, keeps them live and spills: llvm-mca saw 148 stack moves per record.) Same integers
 * and the same float steps in the same order: bit-identical to tile2_q4k. */
AI void tile2_q4k_c1(int nb, const char *w, const char *x, float *y) {
    const size_t rb = PD_KR16_Q4K_BYTES;
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    __m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
    const pd_q8k *xb = (const pd_q8k *)x;
    for (int b = 0; b < nb; b++, xb++) {
        const char *rec = w + (size_t)b * rb;
        kr2_prefetch(rec, rb);
        __m256i isum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m256i al[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() }, ah[2] = { al[0], al[0] };
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i bl = kr2_bcast(xb->qs + 64 * p + 4 * t), bh = kr2_bcast(xb->qs + 64 * p + 32 + 4 * t);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * (8 * p + t) + 32 * h));
                    al[h] = _mm256_add_epi16(al[h], _mm256_maddubs_epi16(_mm256_and_si256(v, lo4), bl));
                    ah[h] = _mm256_add_epi16(ah[h], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), bh));
                    KR2_CHAIN(al[h]); KR2_CHAIN(ah[h]);
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i ow = kr2_q4k_scales(rec, 32 * h, p >= 2);
                isum[h] = KR_KDOT(isum[h], al[h], _mm256_shuffle_epi8(ow, kr2_lane_base(kr2_pair_of_byte(2 * (p & 1)))));
                isum[h] = KR_KDOT(isum[h], ah[h], _mm256_shuffle_epi8(ow, kr2_lane_base(kr2_pair_of_byte(2 * (p & 1) + 1))));
            }
        }
        kr2_q4k_c1_step(acc, rec, xb, isum);
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}

#ifdef KR_BDOT
/* One column with a 4-byte dot instruction (KR_BDOT(acc, u8, s8): AVX-VNNI's vpdpbusd), for the
 * AVX-VNNI table: 4 vector ops per 32 weight bytes instead of tile2_q4k_c1's 7 (llvm-mca,
 * alderlake: its p0/p1/p5 were saturated at 12.8 B/cycle). The low nibbles are v & 0x0f; the high
 * ones stay in place, v & 0xf0 = 16 x the nibble (an unsigned byte <= 240, exact in vpdpbusd's
 * int32 sums), so no shift: their sub-block sums are 16 x the true ones, multiplied by the scale
 * (vpmulld; |sum| <= 16 x 32 x 15 x 128, x 63, x 4 sub-blocks < 2^28) and divided by 16 once per
 * record, exactly (a multiple of 16). The same integers as tile2_q4k_c1 and the same float
 * steps: bit-identical to it. */
AI __m256i kr2_byte_of_lane(int k) {   /* pshufb: byte k of each 32-bit lane, zero-extended */
    return kr2_lane_base(_mm256_set1_epi32((int)(0x80808000u | (uint32_t)k)));
}
AI void tile2_q4k_c1_bdot(int nb, const char *w, const char *x, float *y) {
    const size_t rb = PD_KR16_Q4K_BYTES;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), hi4 = _mm256_set1_epi8((char)0xf0);
    __m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
    const pd_q8k *xb = (const pd_q8k *)x;
    for (int b = 0; b < nb; b++, xb++) {
        const char *rec = w + (size_t)b * rb;
        kr2_prefetch(rec, rb);
        __m256i slo[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() }, shi[2] = { slo[0], slo[0] };
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m256i al[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() }, ah[2] = { al[0], al[0] };
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i bl = kr2_bcast(xb->qs + 64 * p + 4 * t), bh = kr2_bcast(xb->qs + 64 * p + 32 + 4 * t);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * (8 * p + t) + 32 * h));
                    al[h] = KR_BDOT(al[h], _mm256_and_si256(v, lo4), bl);
                    ah[h] = KR_BDOT(ah[h], _mm256_and_si256(v, hi4), bh);
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i ow = kr2_q4k_scales(rec, 32 * h, p >= 2);
                slo[h] = _mm256_add_epi32(slo[h], _mm256_mullo_epi32(al[h], _mm256_shuffle_epi8(ow, kr2_byte_of_lane(2 * (p & 1)))));
                shi[h] = _mm256_add_epi32(shi[h], _mm256_mullo_epi32(ah[h], _mm256_shuffle_epi8(ow, kr2_byte_of_lane(2 * (p & 1) + 1))));
            }
        }
        const __m256i isum[2] = { _mm256_add_epi32(slo[0], _mm256_srai_epi32(shi[0], 4)),
                                  _mm256_add_epi32(slo[1], _mm256_srai_epi32(shi[1], 4)) };
        kr2_q4k_c1_step(acc, rec, xb, isum);
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}
#endif

/* Unpacked quants of group v, quarter Q, of one half (hb: 0 or 32): formats.h's u0..u3. */
AI __m256i kr2_q6k_quants(const char *rec, int v, int Q, int hb) {
    const __m256i m63 = _mm256_set1_epi8(63), m48 = _mm256_set1_epi8(48), m15 = _mm256_set1_epi8(15);
    const char *r = rec + 64 * 3 * v + hb;
    if (Q == 0) return _mm256_and_si256(_mm256_loadu_si256((const __m256i *)r), m63);
    if (Q == 1) return _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + 64)), m63);
    if (Q == 2)
        return _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + 128)), m15),
                               _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)r), 2), m48));
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(r + 128)), 4), m15),
                           _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(r + 64)), 2), m48));
}

AI void tile2_q6k(int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = PD_KR16_Q6K_BYTES;
    __m256 acc2[2][KR2_CMAX];
#pragma GCC unroll 6
    for (int c = 0; c < 2 * C; c++) acc2[c / C][c % C] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *rec = w + (size_t)b * rb;
        kr2_prefetch(rec, rb);
#pragma GCC unroll 2
      for (int half = 0; half < 2; half++) {   /* both halves of a record while it is in L1 */
        const int hb = 32 * half;
        KR2_FENCE();   /* the halves' activation loads stay their own */
        __m256 *acc = acc2[half];
        const pd_q8k *xb[KR2_CMAX];
        __m256i isum[KR2_CMAX];
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) { xb[c] = (const pd_q8k *)(x + c * xs) + b; isum[c] = _mm256_setzero_si256(); }
#pragma GCC unroll 4
        for (int vq = 0; vq < 4; vq++) {
#pragma GCC unroll 4
            for (int Q = 0; Q < 4; Q++) {
                /* sub-block s = 4Q + vq: its 16 values are group v = 4vq..4vq+3 of quarter Q */
                const int s = 4 * Q + vq;
                const __m256i pr = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 3104 + 32 * (s / 2) + 16 * half)));
                const __m256i sc = _mm256_shuffle_epi8(pr, kr2_lane_base(kr2_pair_of_word(s & 1)));
                __m256i a2[KR2_CMAX][2];
#pragma GCC unroll 2
                for (int vv = 0; vv < 4; vv += 2) {
#pragma GCC unroll 2
                    for (int e = 0; e < 2; e++) {
                        const int v = 4 * vq + vv + e;
                        const __m256i u = kr2_q6k_quants(rec, v, Q, hb);
#pragma GCC unroll 3
                        for (int c = 0; c < C; c++) {
                            const __m256i m = _mm256_maddubs_epi16(u, kr2_bcast(xb[c]->qs + 64 * Q + 4 * v));
                            a2[c][vv / 2] = e ? _mm256_add_epi16(a2[c][vv / 2], m) : m;
                        }
                    }
                }
#pragma GCC unroll 3
                for (int c = 0; c < C; c++) {
                    isum[c] = KR_KDOT(isum[c], a2[c][0], sc);
                    isum[c] = KR_KDOT(isum[c], a2[c][1], sc);
                    KR2_CHAIN(isum[c]);
                }
            }
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 3072 + 16 * half)));
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            __m256i off = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i sp = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 3104 + 32 * t + 16 * half)));
                off = KR_KDOT(off, sp, kr2_bcast(xb[c]->bsums + 2 * t));
            }
            isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(off, 5));
            acc[c] = kr2_step(acc[c], xb[c]->d, dv, isum[c], dv, isum[c], 0);
        }
      }
    }
#pragma GCC unroll 6
    for (int c = 0; c < 2 * C; c++) _mm256_storeu_ps(y + (c % C) * ys + 8 * (c / C), acc2[c / C][c % C]);
}

/* One column (decode), both halves at once, as tile2_q4k_c1; bit-identical to tile2_q6k. */
AI void tile2_q6k_c1(int nb, const char *w, const char *x, float *y) {
    const size_t rb = PD_KR16_Q6K_BYTES;
    __m256 acc[2] = { _mm256_setzero_ps(), _mm256_setzero_ps() };
    const pd_q8k *xb = (const pd_q8k *)x;
    for (int b = 0; b < nb; b++, xb++) {
        const char *rec = w + (size_t)b * rb;
        kr2_prefetch(rec, rb);
        __m256i isum[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
#pragma GCC unroll 4
        for (int vq = 0; vq < 4; vq++) {
#pragma GCC unroll 4
            for (int Q = 0; Q < 4; Q++) {
                const int s = 4 * Q + vq;   /* sub-block: group v = 4vq..4vq+3 of quarter Q */
                __m256i a2[2][2];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const int v = 4 * vq + i;
                    const __m256i a = kr2_bcast(xb->qs + 64 * Q + 4 * v);
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        const __m256i m = _mm256_maddubs_epi16(kr2_q6k_quants(rec, v, Q, 32 * h), a);
                        a2[h][i / 2] = i & 1 ? _mm256_add_epi16(a2[h][i / 2], m) : m;
                    }
                }
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i pr = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 3104 + 32 * (s / 2) + 16 * h)));
                    const __m256i sc = _mm256_shuffle_epi8(pr, kr2_lane_base(kr2_pair_of_word(s & 1)));
                    isum[h] = KR_KDOT(isum[h], a2[h][0], sc);
                    isum[h] = KR_KDOT(isum[h], a2[h][1], sc);
                    KR2_CHAIN(isum[h]);
                }
            }
        }
        __m256i off[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m256i bs = kr2_bcast(xb->bsums + 2 * t);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                off[h] = KR_KDOT(off[h], _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + 3104 + 32 * t + 16 * h))), bs);
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 3072)));
        const __m256 dv1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 3088)));
        isum[0] = _mm256_sub_epi32(isum[0], _mm256_slli_epi32(off[0], 5));
        isum[1] = _mm256_sub_epi32(isum[1], _mm256_slli_epi32(off[1], 5));
        acc[0] = kr2_step(acc[0], xb->d, dv, isum[0], dv, isum[0], 0);
        acc[1] = kr2_step(acc[1], xb->d, dv1, isum[1], dv1, isum[1], 0);
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}

AI void tile2_kr16(int RT, int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
#ifdef KR_BDOT
    if (RT == PD_Q4_K_R16 && C == 1) tile2_q4k_c1_bdot(nb, w, x, y);
#else
    if (RT == PD_Q4_K_R16 && C == 1) tile2_q4k_c1(nb, w, x, y);
#endif
    else if (RT == PD_Q4_K_R16) tile2_q4k(C, nb, w, x, xs, y, ys);
    else if (C == 1) tile2_q6k_c1(nb, w, x, y);
    else tile2_q6k(C, nb, w, x, xs, y, ys);
}

AI void matmul_kr16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                    float *y, size_t ys) {
    const int nb = k / PD_QKK;
    /* Columns per pass: Q6_K's 3 would need more than 16 registers (llvm-mca: 3 columns cost
     * 594 cycles per record, 2 cost 305). */
    const int cmax = RT == PD_Q6_K_R16 ? 2 : KR2_CMAX;
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const char *g = (const char *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c += cmax) {
            const char *xc = (const char *)x + (size_t)c * xs;
            float *yc = y + (size_t)c * ys + r;
            switch (ncols - c >= cmax ? cmax : ncols - c) {
            case 1: tile2_kr16(RT, 1, nb, g, xc, xs, yc, ys); break;
            case 2: tile2_kr16(RT, 2, nb, g, xc, xs, yc, ys); break;
            default: tile2_kr16(RT, 3, nb, g, xc, xs, yc, ys); break;
            }
        }
    }
}

static void matmul_q4_k_r16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                            int ncols, float *y, size_t ys) {
    matmul_kr16(PD_Q4_K_R16, k, w, ws, nrows, x, xs, ncols, y, ys);
}
static void matmul_q6_k_r16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                            int ncols, float *y, size_t ys) {
    matmul_kr16(PD_Q6_K_R16, k, w, ws, nrows, x, xs, ncols, y, ys);
}
#endif
