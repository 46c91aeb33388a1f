/* Bit-parallel evaluation of a discretized logic gate network: 64 samples per uint64 word.
 * Blocks of BLOCK_WORDS words (256 samples) are packed from the boolean input rows and run
 * through every layer while they stay in cache; each class group's popcount per sample is
 * accumulated in bit-sliced counters (a ripple adder per word). */
#include <stdint.h>
#include <string.h>

#define BLOCK_WORDS 4
#define MAX_PLANES 40

/* Pack 64 boolean rows (n <= 64 of them valid) into one word per feature: bit s of
 * dst[i * BLOCK_WORDS] is row s's feature i. Eight features at a time: eight rows' 8-byte loads
 * are OR-ed with shifts so that byte k holds 8 samples of feature k, then an 8x8 byte transpose
 * gathers the 64 samples of each feature (little-endian loads). */
static void pack_rows(const uint8_t *rows, int64_t n, int64_t in_dim, uint64_t *dst) {
    int64_t i = 0;
    for (; i + 8 <= in_dim; i += 8) {
        uint64_t x[8];
        for (int g = 0; g < 8; g++) {
            uint64_t acc = 0;
            for (int t = 0; t < 8; t++) {
                const int64_t s = g * 8 + t;
                if (s < n) {
                    uint64_t v;
                    memcpy(&v, rows + s * in_dim + i, 8);
                    acc |= (v & 0x0101010101010101ULL) << t;
                }
            }
            x[g] = acc;
        }
        for (int k = 0; k < 8; k++) {
            uint64_t word = 0;
            for (int g = 0; g < 8; g++) word |= ((x[g] >> (8 * k)) & 0xFFULL) << (8 * g);
            dst[(i + k) * BLOCK_WORDS] = word;
        }
    }
    for (; i < in_dim; i++) {
        uint64_t word = 0;
        for (int64_t s = 0; s < n; s++) word |= (uint64_t)(rows[s * in_dim + i] & 1) << s;
        dst[i * BLOCK_WORDS] = word;
    }
}

#define GATE_CASE(id, expr)                                   \
    case id:                                                  \
        for (int j = 0; j < BLOCK_WORDS; j++) {               \
            uint64_t a = pa[j], b = pb[j];                    \
            (void)a; (void)b;                                 \
            pd[j] = (expr);                                   \
        }                                                     \
        break;

void dlgn_eval(const uint8_t *x, int64_t in_dim, int64_t words, int64_t n_layers,
               const int64_t *widths, const int64_t *idx_a, const int64_t *idx_b,
               const uint8_t *gates, int64_t k, int64_t batch, int64_t *counts,
               uint64_t *buf_a, uint64_t *buf_b) {
    const int64_t n_out = widths[n_layers];
    const int64_t per = n_out / k;
    for (int64_t w0 = 0; w0 < words; w0 += BLOCK_WORDS) {
        const int64_t nw = words - w0 < BLOCK_WORDS ? words - w0 : BLOCK_WORDS;
        uint64_t *src = buf_a, *dst = buf_b;
        for (int64_t j = 0; j < BLOCK_WORDS; j++) {
            const int64_t first = (w0 + j) * 64;
            const int64_t n = j >= nw ? 0 : (batch - first < 64 ? batch - first : 64);
            /* words past the batch are zero-filled from no row at all (n = 0) */
            pack_rows(n ? x + first * in_dim : x, n, in_dim, src + j);
        }
        int64_t off = 0;
        for (int64_t l = 0; l < n_layers; l++) {
            const int64_t n = widths[l + 1];
            for (int64_t i = 0; i < n; i++) {
                const uint64_t *pa = src + idx_a[off + i] * BLOCK_WORDS;
                const uint64_t *pb = src + idx_b[off + i] * BLOCK_WORDS;
                uint64_t *pd = dst + i * BLOCK_WORDS;
                switch (gates[off + i]) {
                    GATE_CASE(0, 0)
                    GATE_CASE(1, a & b)
                    GATE_CASE(2, a & ~b)
                    GATE_CASE(3, a)
                    GATE_CASE(4, ~a & b)
                    GATE_CASE(5, b)
                    GATE_CASE(6, a ^ b)
                    GATE_CASE(7, a | b)
                    GATE_CASE(8, ~(a | b))
                    GATE_CASE(9, ~(a ^ b))
                    GATE_CASE(10, ~b)
                    GATE_CASE(11, a | ~b)
                    GATE_CASE(12, ~a)
                    GATE_CASE(13, ~a | b)
                    GATE_CASE(14, ~(a & b))
                    default:
                        for (int j = 0; j < BLOCK_WORDS; j++) pd[j] = ~(uint64_t)0;
                }
            }
            off += n;
            uint64_t *t = src; src = dst; dst = t;
        }
        for (int64_t c = 0; c < k; c++) {
            uint64_t planes[MAX_PLANES][BLOCK_WORDS];
            memset(planes, 0, sizeof(planes));
            int used = 0;
            for (int64_t i = 0; i < per; i++) {
                const uint64_t *v = src + (c * per + i) * BLOCK_WORDS;
                for (int j = 0; j < BLOCK_WORDS; j++) {
                    uint64_t carry = v[j];
                    for (int p = 0; carry; p++) {
                        uint64_t t = planes[p][j] & carry;
                        planes[p][j] ^= carry;
                        carry = t;
                        if (p + 1 > used) used = p + 1;
                    }
                }
            }
            for (int64_t j = 0; j < nw; j++) {
                for (int bit = 0; bit < 64; bit++) {
                    const int64_t s = (w0 + j) * 64 + bit;
                    if (s >= batch) break;
                    int64_t cnt = 0;
                    for (int p = 0; p < used; p++) cnt |= (int64_t)((planes[p][j] >> bit) & 1) << p;
                    counts[s * k + c] = cnt;
                }
            }
        }
    }
}

int64_t dlgn_block_words(void) { return BLOCK_WORDS; }
