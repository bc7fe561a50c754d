/* A payload read as the layout it had before, in one pass of C (exporter.ingest.promtext).

   read(text, names, templates) finds the lines of `text` that promtext's selection regex
   finds (see `found` below), keys them by their heads, and when `templates` holds a
   template under that key and every found line fits it, returns the template's layout
   and each found sample line's value as a float: what promtext's `_known_values` returns
   for the same text. promtext.py states the rules this file keeps; tests/exporter/
   test_known_lines.py holds it to the Python path on real, mutated and random payloads.

   Returns None when the text holds a byte it leaves to Python (a non-ASCII character
   where the regex reads blanks or a name), (key, None, None) when no template fits, and
   (key, layout, values) when one does.

   A template: (expected, kinds, layout, samples). expected[i] is found line i as str:
   a HELP/TYPE line whole; a sample line's head, all before its last space. kinds[i]: 0
   for a HELP/TYPE line (equal whole), 1 for a sample line (the head, a space, a value with
   no space that float() reads, no `_`), 2 for a sample line whose value is a histogram's
   count (also: not below zero). samples: the found sample lines.
*/
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memrchr */
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* What the regex class [^\S\n] matches among ASCII bytes (Python's \s, less the newline). */
static int blank(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13 && c != 10) || (c >= 28 && c <= 31); }

/* What float() strips around a number, among ASCII bytes. */
static int float_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13); }

enum { COMMENT = 0, SAMPLE = 1, COUNT = 2 };
enum { NOT_FOUND = 0, FOUND = 1, UNSURE = -1 };

/* Whether one of `names` (sorted, none a prefix of another) starts `s`: only the greatest
   name not above `s` can (any name between a prefix of `s` and `s` would start with it). */
static int name_starts(const char *s, Py_ssize_t n, PyObject *names) {
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(names);
    Py_ssize_t best = -1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        PyObject *name = PyTuple_GET_ITEM(names, mid);
        Py_ssize_t len = PyBytes_GET_SIZE(name);
        Py_ssize_t common = len < n ? len : n;
        int cmp = memcmp(PyBytes_AS_STRING(name), s, common);
        if (cmp < 0 || (cmp == 0 && len <= n)) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (best < 0) return 0;
    PyObject *name = PyTuple_GET_ITEM(names, best);
    Py_ssize_t len = PyBytes_GET_SIZE(name);
    return len <= n && memcmp(PyBytes_AS_STRING(name), s, len) == 0;
}

/* Whether the selection regex finds the line:
   [^\S\n]*(?:NAMES|\{|#[^\S\n]+(?:HELP|TYPE)[^\S\n]+"?(?:NAMES)), NAMES any of `names`.
   UNSURE where a non-ASCII byte stands where the regex reads a blank or a name's start. */
static int found(const char *s, Py_ssize_t n, PyObject *names, const char *first) {
    Py_ssize_t i = 0;
    while (i < n && blank((unsigned char)s[i])) i++;
    if (i == n) return NOT_FOUND;
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) return UNSURE;
    if (c == '{') return FOUND;
    if (c != '#') return first[c] && name_starts(s + i, n - i, names);
    Py_ssize_t j = ++i;
    while (i < n && blank((unsigned char)s[i])) i++;
    if (i < n && (unsigned char)s[i] >= 0x80) return UNSURE;
    if (i == j || n - i < 4 || (memcmp(s + i, "HELP", 4) != 0 && memcmp(s + i, "TYPE", 4) != 0))
        return NOT_FOUND;
    j = i += 4;
    while (i < n && blank((unsigned char)s[i])) i++;
    if (i < n && (unsigned char)s[i] >= 0x80) return UNSURE;
    if (i == j) return NOT_FOUND;
    if (i < n && s[i] == '"') i++;
    return i < n && first[(unsigned char)s[i]] && name_starts(s + i, n - i, names);
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h = (h ^ v) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static uint64_t hash_bytes(uint64_t h, const char *p, Py_ssize_t n) {
    h = mix(h, (uint64_t)n);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = mix(h, v);
    }
    uint64_t v = 0;
    memcpy(&v, p, (size_t)n);
    return mix(h, v);
}

/* float(value) for a value of ASCII bytes without `_`; 0 where float() would refuse it or
   the value is one this leaves to Python. */
static int number(const char *v, Py_ssize_t n, double *out) {
    while (n > 0 && float_space((unsigned char)v[0])) v++, n--;
    while (n > 0 && float_space((unsigned char)v[n - 1])) n--;
    /* Most values are whole counts, as `123` or `123.0`: up to 15 digits, a double holds
       them exactly, so adding up the digits gives what the correctly rounded parse gives. */
    Py_ssize_t digits = 0;
    uint64_t whole = 0;
    while (digits < n && digits < 16 && v[digits] >= '0' && v[digits] <= '9')
        whole = whole * 10 + (uint64_t)(v[digits++] - '0');
    if (digits > 0 && digits <= 15) {
        Py_ssize_t i = digits;
        if (i < n && v[i] == '.') {
            i++;
            while (i < n && v[i] == '0') i++;
        }
        if (i == n) {
            *out = (double)whole;
            return 1;
        }
    }
    char buf[64];
    if (n == 0 || n >= (Py_ssize_t)sizeof buf) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c >= 0x80 || c == '_' || c == 0) return 0;
        buf[i] = (char)c;
    }
    buf[n] = 0;
    char *end;
    double d = PyOS_string_to_double(buf, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (end != buf + n) return 0;
    *out = d;
    return 1;
}

typedef struct {
    const char *start;
    Py_ssize_t length;
    Py_ssize_t head; /* bytes before the last space; -1 for a HELP/TYPE line or none */
} Line;

static PyObject *read_known(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *text, *names, *templates;
    if (!PyArg_ParseTuple(args, "UO!O!:read", &text, &PyTuple_Type, &names, &PyDict_Type, &templates))
        return NULL;
    Py_ssize_t size;
    const char *s = PyUnicode_AsUTF8AndSize(text, &size);
    if (s == NULL) { /* a lone surrogate has no UTF-8: Python reads it */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* The bytes a name starts with: a line that starts otherwise is not looked up. */
    char first[256] = {0};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) == 0) {
            PyErr_SetString(PyExc_TypeError, "names: non-empty bytes");
            return NULL;
        }
        first[(unsigned char)PyBytes_AS_STRING(name)[0]] = 1;
    }
    Py_ssize_t capacity = 256, count = 0;
    Line *lines = PyMem_Malloc(capacity * sizeof(Line));
    if (lines == NULL) return PyErr_NoMemory();
    PyObject *result = NULL, *template = NULL;
    uint64_t key = 0x51ED270B27A1F3C5ull;
    const char *p = s, *end = s + size;
    for (;;) {
        const char *newline = memchr(p, '\n', (size_t)(end - p));
        const char *stop = newline ? newline : end;
        Py_ssize_t n = stop - p;
        int is = found(p, n, names, first);
        if (is == UNSURE) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (is == FOUND) {
            if (count == capacity) {
                capacity *= 2;
                Line *more = PyMem_Realloc(lines, capacity * sizeof(Line));
                if (more == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                lines = more;
            }
            Py_ssize_t head = -1;
            if (n > 0 && p[0] != '#') {
                const char *space = memrchr(p, ' ', (size_t)n);
                head = space ? space - p : -1;
            }
            lines[count++] = (Line){p, n, head};
            key = hash_bytes(key, p, head >= 0 ? head : n);
        }
        if (newline == NULL) break;
        p = newline + 1;
    }
    PyObject *key_object = PyLong_FromUnsignedLongLong(key);
    if (key_object == NULL) goto done;
    /* Held for the call: the allocations below could run code that empties `templates`. */
    template = Py_XNewRef(PyDict_GetItemWithError(templates, key_object));
    if (template == NULL || !PyTuple_Check(template) || PyTuple_GET_SIZE(template) != 4) {
        if (PyErr_Occurred()) {
            Py_DECREF(key_object);
            goto done;
        }
        result = Py_BuildValue("(NOO)", key_object, Py_None, Py_None);
        goto done;
    }
    PyObject *expected = PyTuple_GET_ITEM(template, 0);
    PyObject *kinds = PyTuple_GET_ITEM(template, 1);
    PyObject *layout = PyTuple_GET_ITEM(template, 2);
    PyObject *sample_count = PyTuple_GET_ITEM(template, 3);
    PyObject *values = NULL;
    if (!PyTuple_Check(expected) || !PyBytes_Check(kinds) || !PyLong_Check(sample_count) ||
        PyTuple_GET_SIZE(expected) != count || PyBytes_GET_SIZE(kinds) != count)
        goto miss;
    Py_ssize_t samples = PyLong_AsSsize_t(sample_count);
    if (samples < 0) {
        PyErr_Clear();
        goto miss;
    }
    values = PyList_New(samples);
    if (values == NULL) {
        Py_DECREF(key_object);
        goto done;
    }
    const char *kind = PyBytes_AS_STRING(kinds);
    Py_ssize_t sample = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t want;
        const char *w = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(expected, i), &want);
        if (w == NULL) {
            PyErr_Clear();
            goto miss;
        }
        Line line = lines[i];
        if (kind[i] == COMMENT) {
            if (line.head != -1 || line.length != want || memcmp(line.start, w, (size_t)want) != 0) goto miss;
            continue;
        }
        if (line.head != want || memcmp(line.start, w, (size_t)want) != 0 || sample >= samples) goto miss;
        double d;
        if (!number(line.start + want + 1, line.length - want - 1, &d)) goto miss;
        if (kind[i] == COUNT && d < 0.0) goto miss;
        PyObject *value = PyFloat_FromDouble(d);
        if (value == NULL) {
            Py_DECREF(values);
            Py_DECREF(key_object);
            goto done;
        }
        PyList_SET_ITEM(values, sample++, value);
    }
    if (sample != samples) goto miss;
    result = Py_BuildValue("(NON)", key_object, layout, values);
    goto done;
miss:
    Py_XDECREF(values);
    result = Py_BuildValue("(NOO)", key_object, Py_None, Py_None);
done:
    Py_XDECREF(template);
    PyMem_Free(lines);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_known, METH_VARARGS, "read(text, names, templates): see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_known_lines", "A payload read as the layout it had before, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__known_lines(void) { return PyModule_Create(&module); }
