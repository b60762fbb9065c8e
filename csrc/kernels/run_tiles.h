/* The walk of a matmul's output in tiles, shared by every SIMD table (kernels/x86/, kernels/arm/).
 * Plain C: a macro over the caller's nrows, ncols and a tile macro. */
#ifndef PD_RUN_TILES_H
#define PD_RUN_TILES_H
/* Tiles over the whole output: 4-row tiles (then single rows), each across all columns in
 * groups of up to CM. tile(R, C, row0, col0) must be a macro of constant R, C. */
#define RUN_TILES(CM, TILE)                                                                   \
    _Static_assert(CM >= 1 && CM <= 4, "RUN_TILES has cases for up to 4 columns");            \
    for (int r = 0; r < nrows;) {                                                             \
        const int R = nrows - r >= 4 ? 4 : 1;                                                 \
        for (int c = 0; c < ncols;) {                                                         \
            const int C = ncols - c >= CM ? CM : ncols - c;                                   \
            switch (R * 8 + C) {                                                              \
            case 4 * 8 + 1: TILE(4, 1, r, c); break;                                          \
            case 4 * 8 + 2: TILE(4, CM > 1 ? 2 : 1, r, c); break;                             \
            case 4 * 8 + 3: TILE(4, CM > 2 ? 3 : 1, r, c); break;                             \
            case 4 * 8 + 4: TILE(4, CM > 3 ? 4 : 1, r, c); break;                             \
            case 1 * 8 + 1: TILE(1, 1, r, c); break;                                          \
            case 1 * 8 + 2: TILE(1, CM > 1 ? 2 : 1, r, c); break;                             \
            case 1 * 8 + 3: TILE(1, CM > 2 ? 3 : 1, r, c); break;                             \
            default:        TILE(1, CM > 3 ? 4 : 1, r, c); break;                             \
            }                                                                                 \
            c += C;                                                                           \
        }                                                                                     \
        r += R;                                                                               \
    }
#endif
