/* Attention of one query per row over that row's own cache length (a ragged batch), for
 * the CPU.
 *
 * Row r reads positions 0 .. lengths[r]-1 of cache slot slots[r]: a decode row its own
 * sequence so far, a prefill token its context up to itself (causal). A step then reads
 * the keys and values its rows hold, not rows x longest row as a padded batch does; this
 * is what a paged attention kernel does. The demo server loads it with ctypes
 * (demo_server/generation/ragged.py) and falls back to padded torch attention without a compiler.
 *
 * Layouts (strides in elements):
 *   q:      [rows, heads, head_dim], q[r, h, i] = q[r*q_row + h*q_head + i]
 *   keys:   cache [slots_in_cache, heads, max_len, head_dim], contiguous
 *   values: same layout as keys
 *   out:    [rows, heads, head_dim], contiguous
 *   scratch: at least max_len floats
 * A row whose slot is out of range or whose length is not positive gets zeros, and so does
 * every row when head_dim exceeds 256 (the Python side refuses that first).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 to about 2e-7 relative: 2^n * p(f), p a degree-6 polynomial of
 * 2^f on [0, 1). Unlike expf it vectorises. */
static inline float exp_nonpositive(float x) {
    if (x < -87.0f) x = -87.0f;
    const float t = x * 1.4426950408889634f;
    const float n = floorf(t);
    const float f = t - n;
    float p = 1.5353362e-4f;
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += ((int32_t)n) << 23;
    memcpy(&p, &bits, 4);
    return p;
}

/* One (row, head): softmax(scale * q . k_p) over p < length, then the weighted sum of v_p.
 * Inlined with D = 16 (the demo model's head size) so the inner loops unroll. */
static inline void one_head(const float *restrict qp, const float *restrict kp,
                            const float *restrict vp, float *restrict op,
                            float *restrict scratch, int64_t length, int64_t D, float scale) {
    float best = -INFINITY;
    for (int64_t p = 0; p < length; p++) {
        const float *kr = kp + p * D;
        float s = 0.0f;
        for (int64_t i = 0; i < D; i++) s += qp[i] * kr[i];
        s *= scale;
        scratch[p] = s;
        best = s > best ? s : best;
    }
    float total = 0.0f;
    for (int64_t p = 0; p < length; p++) {
        const float w = exp_nonpositive(scratch[p] - best);
        scratch[p] = w;
        total += w;
    }
    float acc[256];
    for (int64_t i = 0; i < D; i++) acc[i] = 0.0f;
    for (int64_t p = 0; p < length; p++) {
        const float *vr = vp + p * D;
        const float w = scratch[p];
        for (int64_t i = 0; i < D; i++) acc[i] += w * vr[i];
    }
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < D; i++) op[i] = acc[i] * inv;
}

void ragged_decode_attention(const float *q, int64_t q_row, int64_t q_head,
                             const float *keys, const float *values, int64_t slots_in_cache,
                             const int64_t *slots, const int64_t *lengths, float *out,
                             float *scratch, int64_t rows, int64_t heads, int64_t max_len,
                             int64_t head_dim, float scale) {
    const int64_t slot_stride = heads * max_len * head_dim;
    const int64_t head_stride = max_len * head_dim;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t slot = slots[r];
        int64_t length = lengths[r];
        if (length > max_len) length = max_len;
        for (int64_t h = 0; h < heads; h++) {
            const float *qp = q + r * q_row + h * q_head;
            float *op = out + (r * heads + h) * head_dim;
            if (length <= 0 || slot < 0 || slot >= slots_in_cache || head_dim > 256) {
                for (int64_t i = 0; i < head_dim; i++) op[i] = 0.0f;
                continue;
            }
            const float *kp = keys + slot * slot_stride + h * head_stride;
            const float *vp = values + slot * slot_stride + h * head_stride;
            if (head_dim == 16) one_head(qp, kp, vp, op, scratch, length, 16, scale);
            else one_head(qp, kp, vp, op, scratch, length, head_dim, scale);
        }
    }
}
