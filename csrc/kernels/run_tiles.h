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

/* The walk of a matmul over a 16-row repacked layout (formats.h: PD_*_R16; nrows a multiple of
 * 16): each group of 16 rows, the columns in groups of up to 4, each group in PARTS passes over
 * the rows' records (x86's 256-bit tiles: 2 halves of 8 rows; ARM: 4 quarters of 4).
 * tile(C, part, g, xc, yc): C constant; g the group's records, xc its first column, yc the
 * output of its first row and column (the tile offsets its part's rows itself). */
#define RUN_R16_TILES(PARTS, TILE)                                                            \
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {                                            \
        const char *g = (const char *)w + (size_t)r * ws;                                     \
        for (int c = 0; c < ncols; c += 4) {                                                  \
            const char *xc = (const char *)x + (size_t)c * xs;                                \
            float *yc = y + (size_t)c * ys + r;                                               \
            for (int part = 0; part < (PARTS); part++)                                        \
                switch (ncols - c >= 4 ? 4 : ncols - c) {                                     \
                case 1: TILE(1, part, g, xc, yc); break;                                      \
                case 2: TILE(2, part, g, xc, yc); break;                                      \
                case 3: TILE(3, part, g, xc, yc); break;                                      \
                default: TILE(4, part, g, xc, yc); break;                                     \
                }                                                                             \
        }                                                                                     \
    }
#endif
