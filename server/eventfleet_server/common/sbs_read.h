/* Reading SBS (hat-sbs 0.7) from a bytes buffer: what the replica's C extensions that
 * walk untrusted messages share (syncer/_rows.c, eventer/_register.c). Every reader
 * stays inside the buffer and reports "off the fast path" instead of raising, so that
 * the caller can return None and let its Python path name the error.
 *
 * Include after <Python.h> (with PY_SSIZE_T_CLEAN) and <stdint.h>. */
#ifndef EVENTFLEET_SBS_READ_H
#define EVENTFLEET_SBS_READ_H

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos, end;
} cursor;

/* The SBS Integer at the cursor (sbsint.read_int's rule: big-endian 7-bit groups, the
 * last with 0x80 set, the sign in bit 0x40 of the first byte, at most 10 bytes), if it
 * fits an int64. 0, or -1 when truncated, too long or too large (off the fast path). */
static inline int
read_int(cursor *c, int64_t *out)
{
    if (c->pos >= c->end)
        return -1;
    unsigned char b = c->buf[c->pos];
    if ((b & 0xC0) == 0x80) { /* one non-negative byte, nearly always */
        c->pos++;
        *out = b & 0x3F;
        return 0;
    }
    Py_ssize_t last = c->end - c->pos > 10 ? c->pos + 10 : c->end;
    int64_t v = (b & 0x40) ? -1 : 0;
    for (Py_ssize_t p = c->pos; p < last; p++) {
        b = c->buf[p];
        if (v > INT64_MAX / 128 || v < INT64_MIN / 128)
            return -1;
        v = v * 128 + (b & 0x7F); /* == (v << 7) | group, without shifting a negative */
        if (b & 0x80) {
            c->pos = p + 1;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A length or count: non-negative and within the bytes left. */
static inline int
read_len(cursor *c, Py_ssize_t *out)
{
    int64_t v;
    if (read_int(c, &v) < 0 || v < 0 || v > c->end - c->pos)
        return -1;
    *out = (Py_ssize_t)v;
    return 0;
}

/* A str of the `n` UTF-8 bytes at `p`; NULL with *off set when they are not valid UTF-8
 * (no Python error left set), NULL with a Python error otherwise. */
static PyObject *
decode_text(const unsigned char *p, Py_ssize_t n, int *off)
{
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        *off = 1;
    }
    return s;
}

#endif /* EVENTFLEET_SBS_READ_H */
