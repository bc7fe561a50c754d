/* The histogram estimate of static utilisation, in C (exporter.core.static_util).

   estimate(bounds, counts, sum, batch_size) is `estimate_from_histogram` of the same
   histogram, step for step in the same order, so to the last bit: it returns
   (requests, estimate, lower, upper), () where the estimate is None, and None where it
   declines and leaves the histogram to the Python, which then says what it says (raises,
   or works with numbers this file does not hold exactly). static_util.py states the
   model and the rules; tests/exporter/test_static_util.py holds this file to it.

   Why C: the estimate runs at every evaluation of every series, and in Python it was
   about a tenth of a fleet's evaluation (50 us a series, for ten buckets).

   What keeps it to the bit:
   - Python's integers here (bucket counts and ranks, and in the integer narrowing each
     bucket's floor(edge) and count x floor(edge) and their sums) are held as doubles,
     which hold integers exactly below 2^53: counts at or above 2^52, and a count x edge
     or a sum of them at or above 2^53, are declined.
   - An int divided by an int in Python (a rank by n) is the double division when both
     are below 2^53; `x ** n` is libm's pow, as float_pow calls it for a base in [0, 1].
   - sum() of floats adds them in order into a double (CPython 3.11; 3.12 compensates,
     so static_util.py takes this path on 3.11 only); min(a, b) is b if b < a else a,
     max(a, b) is b if b > a else a, NaNs included.
   - A division by zero, a NaN or infinite `_sum` or count, counts and bounds of unequal
     length, a NaN or -inf bound, more than 64 buckets, anything but a tuple of floats for
     the bounds, of floats or ints for the counts, and a float `_sum`: declined (Python
     raises, or answers as it does).
   - libm's pow, here as in float_pow; glibc sets no range error for a subnormal result,
     so Python raises none either.
   Compiled with -ffp-contract=off (pyproject.toml): no fused multiply-add, none in Python.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

static const double EXACT = 9007199254740992.0;      /* 2^53 */
static const double COUNT_LIMIT = 4503599627370496.0; /* 2^52 */

typedef struct {
    double count, rank_below, edge_low, edge_high, low, high;
} Bucket;

enum { NO_INTEGERS = -1, DECLINED = -2 };

static double min2(double a, double b) { return b < a ? b : a; }
static double max2(double a, double b) { return b > a ? b : a; }

/* `_buckets`: the non-empty buckets into `out`; their number, NO_INTEGERS where the
   integer narrowing leaves a bucket none (Python's None). `sums` gets `_sum_range`. */
static Py_ssize_t buckets_of(const double *bounds, const double *counts, Py_ssize_t k,
                             int integer, Bucket *out, double sums[2]) {
    Py_ssize_t m = 0;
    double rank = 0.0, edge_low = 0.0;
    for (Py_ssize_t i = 0; i < k; i++) {
        double bound = bounds[i];
        double count = rint(counts[i]) - rank; /* round(cumulative) - rank, exact */
        if (count > 0) {
            double low, high;
            if (integer) {
                /* The first bucket holds lengths from 0; one above edge a, from floor(a) + 1. */
                low = i == 0 ? 0.0 : floor(edge_low) + 1.0;
                high = isfinite(bound) ? floor(bound) : INFINITY;
                if (high < low)
                    return NO_INTEGERS;
            } else {
                low = edge_low;
                high = bound;
            }
            out[m++] = (Bucket){count, rank, edge_low, bound, low, high};
            rank += count;
        }
        if (isfinite(bound) && bound > edge_low)
            edge_low = bound;
    }
    /* _sum_range: sum(count * low), sum(count * high). With integer narrowing a finite
       high is a Python int, and so is count x high and their sum until a float joins. */
    double least = 0.0, greatest = 0.0;
    int whole = integer;
    for (Py_ssize_t j = 0; j < m; j++) {
        least += out[j].count * out[j].low;
        double product = out[j].count * out[j].high;
        if (integer && isfinite(out[j].high)) {
            if (fabs(product) >= EXACT || (whole && fabs(greatest + product) >= EXACT))
                return DECLINED;
        } else {
            whole = 0;
        }
        greatest += product;
    }
    sums[0] = least;
    sums[1] = greatest;
    return m;
}

static double max_cdf(double rank, double n, double size) { return pow(rank / n, size); }

/* `_interpolated_expected_max`; NAN where Python would divide by zero. */
static double interpolated_expected_max(const Bucket *b, Py_ssize_t m, double n, double total,
                                        double size) {
    const Bucket *overflow = NULL;
    double weighted_width = 0.0, low_sum = 0.0, high_sum = 0.0;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (isinf(b[j].edge_high)) {
            if (overflow == NULL)
                overflow = &b[j];
            continue;
        }
        double low = max2(b[j].edge_low, 0.0);
        weighted_width += b[j].count * (b[j].edge_high - low);
        low_sum += b[j].count * low;
        high_sum += b[j].count * b[j].edge_high;
    }
    double overflow_at = 0.0, target = total;
    if (overflow != NULL) {
        double uniform_sum = (low_sum + high_sum) / 2.0;
        overflow_at = max2(overflow->edge_low, (total - uniform_sum) / overflow->count);
        target = total - overflow->count * overflow_at;
    }
    int from_low = target <= (low_sum + high_sum) / 2.0;
    double spread;
    if (weighted_width <= 0)
        spread = 0.0;
    else if (from_low)
        spread = 2.0 * (target - low_sum) / weighted_width;
    else
        spread = 2.0 * (high_sum - target) / weighted_width;
    spread = min2(max2(spread, 0.0), 1.0);

    double expected = 0.0, below = 0.0, x = 0.0;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (isinf(b[j].edge_high))
            continue;
        double low = max2(b[j].edge_low, 0.0);
        double width = (b[j].edge_high - low) * spread;
        double start = from_low ? low : b[j].edge_high - width;
        expected += (start - x) * (1.0 - pow(below, size));
        double above = (b[j].rank_below + b[j].count) / n;
        if (width > 0) {
            double divisor = (size + 1.0) * (above - below);
            if (divisor == 0.0)
                return NAN;
            double power_mean = (pow(above, size + 1.0) - pow(below, size + 1.0)) / divisor;
            expected += width * (1.0 - power_mean);
        }
        below = above;
        x = start + width;
    }
    if (overflow != NULL)
        expected += (overflow_at - x) * (1.0 - pow(below, size));
    return expected;
}

/* `_estimate_and_bounds`: 0, or -1 where Python would divide by zero. */
static int estimate_and_bounds(const Bucket *b, const double *weights, Py_ssize_t m, double n,
                               double total, double floor_sum, double size, double out[3]) {
    double mean = total / n;
    double budget = total - floor_sum;
    double floor_max = 0.0;
    for (Py_ssize_t j = 0; j < m; j++)
        floor_max += b[j].low * weights[j];

    double largest_max = floor_max, remaining = budget;
    for (Py_ssize_t j = m - 1; j >= 0; j--) {
        if (remaining <= 0)
            break;
        double top = b[j].rank_below + b[j].count;
        double width = b[j].high - b[j].low;
        if (isinf(width)) {
            largest_max += remaining * (max_cdf(top, n, size) - max_cdf(top - 1.0, n, size));
            remaining = 0.0;
        } else if (width > 0) {
            if (remaining >= width * b[j].count) {
                largest_max += width * weights[j];
                remaining -= width * b[j].count;
            } else {
                double share = remaining / width;
                if (!isfinite(share))
                    return -1; /* math.floor raises on a NaN or an infinity */
                double full = floor(share);
                double rest = remaining - full * width;
                largest_max += width * (max_cdf(top, n, size) - max_cdf(top - full, n, size));
                largest_max +=
                    rest * (max_cdf(top - full, n, size) - max_cdf(top - full - 1.0, n, size));
                remaining = 0.0;
            }
        }
    }

    double smallest_max = 0.0;
    remaining = budget;
    for (Py_ssize_t j = 0; j < m; j++) {
        double added = min2(remaining, (b[j].high - b[j].low) * b[j].count);
        remaining -= added;
        smallest_max += (b[j].low + added / b[j].count) * weights[j];
    }
    if (smallest_max == 0.0 || largest_max == 0.0)
        return -1;
    double upper = min2(1.0, mean / smallest_max);
    double lower = min2(upper, mean / largest_max);
    double interpolated = interpolated_expected_max(b, m, n, total, size);
    if (isnan(interpolated))
        return -1;
    out[0] = interpolated > 0 ? min2(max2(mean / interpolated, lower), upper) : upper;
    out[1] = lower;
    out[2] = upper;
    return 0;
}

/* The floats of a tuple into `out`; 0 where one is not a float, or, with `ints`, an int
   (the caller bounds its size). A count may be an int: round() makes every count one. A
   bound may not: an int bound is added up exactly in Python where this adds doubles. */
static int doubles_of(PyObject *tuple, int ints, double *out) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyFloat_CheckExact(item))
            out[i] = PyFloat_AS_DOUBLE(item);
        else if (ints && PyLong_CheckExact(item)) {
            out[i] = PyLong_AsDouble(item);
            if (out[i] == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else
            return 0;
    }
    return 1;
}

static PyObject *estimate(PyObject *self, PyObject *args) {
    PyObject *bounds_tuple, *counts_tuple, *sum_object, *size_object;
    if (!PyArg_ParseTuple(args, "OOOO", &bounds_tuple, &counts_tuple, &sum_object, &size_object))
        return NULL;
    if (!PyTuple_CheckExact(bounds_tuple) || !PyTuple_CheckExact(counts_tuple) ||
        !PyFloat_CheckExact(sum_object) || !PyLong_CheckExact(size_object))
        Py_RETURN_NONE;
    int overflow;
    long long batch_size = PyLong_AsLongLongAndOverflow(size_object, &overflow);
    double sum = PyFloat_AS_DOUBLE(sum_object);
    Py_ssize_t k = PyTuple_GET_SIZE(bounds_tuple);
    if (overflow || k != PyTuple_GET_SIZE(counts_tuple) || k > 64 || !isfinite(sum) ||
        batch_size < 2 || (double)batch_size >= COUNT_LIMIT)
        Py_RETURN_NONE;
    double bounds[64], counts[64], weights[64], sums[2];
    Bucket buckets[64];
    if (!doubles_of(bounds_tuple, 0, bounds) || !doubles_of(counts_tuple, 1, counts))
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < k; i++)
        if (isnan(bounds[i]) || bounds[i] == -INFINITY || !isfinite(counts[i]) ||
            fabs(counts[i]) >= COUNT_LIMIT)
            Py_RETURN_NONE;

    Py_ssize_t m = buckets_of(bounds, counts, k, 1, buckets, sums);
    if (m == DECLINED)
        Py_RETURN_NONE;
    /* _sum_fits: the integer narrowing stands when `_sum` is a sum it allows. */
    if (m == NO_INTEGERS || !(sums[0] - 0.5 <= sum && sum <= sums[1] + 0.5))
        m = buckets_of(bounds, counts, k, 0, buckets, sums);
    if (m <= 0)
        return PyTuple_New(0);
    double n = buckets[m - 1].rank_below + buckets[m - 1].count;
    double floor_sum = sums[0], ceiling_sum = sums[1];
    double total = min2(max2(sum, floor_sum), ceiling_sum);
    if (total <= 0)
        return PyTuple_New(0);
    double size = (double)batch_size;
    for (Py_ssize_t j = 0; j < m; j++)
        weights[j] = pow((buckets[j].rank_below + buckets[j].count) / n, size) -
                     pow(buckets[j].rank_below / n, size);
    double result[3];
    if (estimate_and_bounds(buckets, weights, m, n, total, floor_sum, size, result) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(dddd)", n, result[0], result[1], result[2]);
}

static PyMethodDef methods[] = {
    {"estimate", estimate, METH_VARARGS,
     "estimate(bounds, counts, sum, batch_size): see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_static_estimate",
    "The histogram estimate of static utilisation, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__static_estimate(void) { return PyModule_Create(&module); }
