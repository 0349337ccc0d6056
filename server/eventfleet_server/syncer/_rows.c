/* eventfleet_server.syncer._rows: a received MsgEvents walked into merge rows, in C.
 *
 * Why: `syncer/rows.py`'s `_walk` costs ~4 us of Python per event in a catch-up, about a
 * fifth of the receiving replica's CPU. This is the same walk, ~6 times faster (0.22
 * against 1.3 us per event in a micro-benchmark, docs/decisions.md).
 *
 * `walk(data, server_id, types)` gives exactly the list `_walk` gives, or None whenever
 * anything is off the fast path: malformed or truncated data, a type not in `types`
 * (only `_walk` fills that cache), an id or timestamp outside the cheap bounds, invalid
 * UTF-8, anything too large for an int64. `rows.decode_rows` then runs `_walk`, which
 * either handles the case or raises its precise ProtocolError: every error message
 * stays in one place. Only Python's own errors are raised here (a wrong argument
 * type, MemoryError).
 *
 * What it does not need from `_walk`: the byte comparisons it uses to skip a repeated
 * server/session, type or timestamp. Those give the values the bytes encode, which is
 * what this decodes every time (cheap in C).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../common/sbs_read.h" /* cursor, read_int, read_len, decode_text */

/* rows.py's constants: ids are stored as SQLite 64-bit integers (wire.MAX_ID), and
 * the cheap timestamp bounds of `_us`. */
#define US 1000000
#define MAX_S (INT64_MAX / US - 1)
#define MIN_S (-(INT64_MAX / US) + 1)
#define KIND_NONE 0
#define KIND_BINARY 1
#define KIND_JSON 2

/* The smallest event: server, session, instance, type count, two timestamp Integers and
 * the two Optional bytes, one byte each. */
#define MIN_EVENT 8

/* Types remembered during one call (a message carries a few), so that a repeated type
 * is a memcmp against its earlier bytes instead of a bytes object and a dict lookup. */
#define TYPE_SLOTS 8

/* A Timestamp {s, us} in microseconds, within `_us`'s cheap bounds (`_us` decides the
 * rest, near the edges of the storable range). */
static inline int
read_timestamp(cursor *c, int64_t *out)
{
    int64_t s, us;
    if (read_int(c, &s) < 0 || read_int(c, &us) < 0)
        return -1;
    if (!(0 <= us && us < US && MIN_S < s && s < MAX_S))
        return -1;
    *out = s * US + us;
    return 0;
}


typedef struct {
    Py_ssize_t start, size; /* the encoded type, in the message */
    PyObject *value;        /* its tuple from `types` (a reference held) */
} type_slot;

typedef struct {
    type_slot slots[TYPE_SLOTS];
    int used, next;
} type_cache;

/* The value of `types` for the encoded type buf[start:start + size], a new reference;
 * NULL with *off set when it is not there, NULL with a Python error on failure. */
static PyObject *
lookup_type(type_cache *tc, PyObject *types, const unsigned char *buf, Py_ssize_t start,
            Py_ssize_t size, int *off)
{
    for (int i = 0; i < tc->used; i++) {
        type_slot *s = &tc->slots[i];
        if (s->size == size && memcmp(buf + s->start, buf + start, (size_t)size) == 0)
            return Py_NewRef(s->value);
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)buf + start, size);
    if (key == NULL)
        return NULL;
    PyObject *value = PyDict_GetItemWithError(types, key); /* borrowed */
    Py_DECREF(key);
    if (value == NULL || value == Py_None) {
        if (!PyErr_Occurred())
            *off = 1;
        return NULL;
    }
    type_slot *s = &tc->slots[tc->next];
    if (tc->used < TYPE_SLOTS)
        tc->used++;
    else
        Py_DECREF(s->value);
    tc->next = (tc->next + 1) % TYPE_SLOTS;
    s->start = start;
    s->size = size;
    s->value = Py_NewRef(value); /* held: the dict is not ours */
    return Py_NewRef(value);
}

/* An int object for `v`, reusing *obj while the value repeats (a session's events share
 * their timestamp, often their source timestamp). */
static PyObject *
cached_int(int64_t v, int64_t *last, PyObject **obj)
{
    if (*obj == NULL || *last != v) {
        PyObject *o = PyLong_FromLongLong(v);
        if (o == NULL)
            return NULL;
        Py_XSETREF(*obj, o);
        *last = v;
    }
    return Py_NewRef(*obj);
}

typedef struct {
    PyObject *types;        /* the stream's cache: encoded type -> checked type */
    int64_t server_id;      /* the stream's */
    int64_t server, session; /* the first event's: every event has them */
    PyObject *server_obj, *session_obj;
    int64_t ts, sts; /* the last timestamp and source timestamp made an object */
    PyObject *ts_obj, *sts_obj;
    type_cache tc;
} walk_state;

static void
walk_state_clear(walk_state *w)
{
    Py_CLEAR(w->server_obj);
    Py_CLEAR(w->session_obj);
    Py_CLEAR(w->ts_obj);
    Py_CLEAR(w->sts_obj);
    for (int i = 0; i < w->tc.used; i++)
        Py_DECREF(w->tc.slots[i].value);
    w->tc.used = 0;
}

/* Where one event's parts are in the message. */
typedef struct {
    Py_ssize_t start, end; /* the whole event */
    int64_t instance, ts, sts;
    int has_sts, kind;
    Py_ssize_t type_at, type_size, text_at, text_size, data_at, data_size;
} event;

/* Reads the event at the cursor into `e`, checking everything but its type and text
 * (`make_row` does, making their objects). 0, or -1 when off the fast path. The first
 * event (i == 0) sets the server and session every other event must have. */
static int
parse_event(cursor *c, walk_state *w, Py_ssize_t i, event *e)
{
    int64_t server, session;
    e->start = c->pos;
    if (read_int(c, &server) < 0 || read_int(c, &session) < 0 || read_int(c, &e->instance) < 0)
        return -1;
    if (i == 0) {
        /* an id fits 0..2^63-1, a non-negative int64 */
        if (server != w->server_id || session < 0)
            return -1;
        w->server = server;
        w->session = session;
    } else if (server != w->server || session != w->session) {
        return -1; /* compared as values, however encoded: as `_walk` reads them */
    }
    if (e->instance < 0)
        return -1;

    /* type: Array(String), walked to find its end; looked up by its bytes */
    Py_ssize_t segments, n;
    e->type_at = c->pos;
    if (read_len(c, &segments) < 0)
        return -1;
    for (Py_ssize_t k = 0; k < segments; k++) {
        if (read_len(c, &n) < 0)
            return -1;
        c->pos += n;
    }
    e->type_size = c->pos - e->type_at;

    if (read_timestamp(c, &e->ts) < 0 || c->pos >= c->end)
        return -1;
    unsigned char option = c->buf[c->pos++]; /* sourceTimestamp: Optional(Timestamp) */
    e->has_sts = option == 0x81;
    if (e->has_sts ? read_timestamp(c, &e->sts) < 0 : option != 0x80)
        return -1;

    /* payload: Optional(Choice {binary: Record {type, data}, json: String}) */
    if (c->pos >= c->end)
        return -1;
    option = c->buf[c->pos++];
    e->kind = KIND_NONE;
    if (option == 0x81) {
        if (c->pos >= c->end)
            return -1;
        unsigned char choice = c->buf[c->pos++];
        if (choice != 0x80 && choice != 0x81)
            return -1;
        e->kind = choice == 0x81 ? KIND_JSON : KIND_BINARY;
        if (read_len(c, &e->text_size) < 0)
            return -1;
        e->text_at = c->pos;
        c->pos += e->text_size;
        if (e->kind == KIND_BINARY) {
            if (read_len(c, &e->data_size) < 0)
                return -1;
            e->data_at = c->pos;
            c->pos += e->data_size;
        }
    } else if (option != 0x80) {
        return -1;
    }
    e->end = c->pos;
    return 0;
}

/* The merge row of a parsed event (`_walk`'s 11 items), a new reference; NULL with *off
 * set when its type is not in `types` or its text is not UTF-8, NULL with a Python
 * error on failure. */
static PyObject *
make_row(walk_state *w, const unsigned char *buf, const event *e, int *off)
{
    PyObject *row = PyList_New(11), *item;
    if (row == NULL)
        return NULL;
    /* A list's empty slots are NULL, which its deallocation skips. */
#define SET(index, expr)                                                                    \
    do {                                                                                    \
        if ((item = (expr)) == NULL)                                                        \
            goto fail;                                                                      \
        PyList_SET_ITEM(row, index, item);                                                  \
    } while (0)
    SET(4, lookup_type(&w->tc, w->types, buf, e->type_at, e->type_size, off));
    SET(0, Py_NewRef(Py_None));
    SET(1, Py_NewRef(w->server_obj));
    SET(2, Py_NewRef(w->session_obj));
    SET(3, PyLong_FromLongLong(e->instance));
    SET(5, cached_int(e->ts, &w->ts, &w->ts_obj));
    SET(6, e->has_sts ? cached_int(e->sts, &w->sts, &w->sts_obj) : Py_NewRef(Py_None));
    SET(7, PyLong_FromLong(e->kind));
    if (e->kind == KIND_NONE) {
        SET(8, Py_NewRef(Py_None));
        SET(9, Py_NewRef(Py_None));
    } else if (e->kind == KIND_JSON) {
        SET(8, Py_NewRef(Py_None));
        SET(9, decode_text(buf + e->text_at, e->text_size, off));
    } else {
        SET(8, decode_text(buf + e->text_at, e->text_size, off));
        SET(9, PyBytes_FromStringAndSize((const char *)buf + e->data_at, e->data_size));
    }
    SET(10, PyBytes_FromStringAndSize((const char *)buf + e->start, e->end - e->start));
#undef SET
    return row;
fail:
    Py_DECREF(row);
    return NULL;
}

static PyObject *
rows_walk(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *data, *server_id, *types;
    if (!PyArg_ParseTuple(args, "O!O!O!:walk", &PyBytes_Type, &data, &PyLong_Type, &server_id,
                          &PyDict_Type, &types))
        return NULL;
    if (!PyDict_CheckExact(types))
        Py_RETURN_NONE; /* a subclass may look up otherwise: `_walk` calls its `get` */
    int overflow;
    long long sid = PyLong_AsLongLongAndOverflow(server_id, &overflow);
    if (sid == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        Py_RETURN_NONE;

    cursor c = {(const unsigned char *)PyBytes_AS_STRING(data), 0, PyBytes_GET_SIZE(data)};
    int64_t count;
    /* A count the bytes cannot hold fails in `_walk` anyway: no list is made for it. */
    if (read_int(&c, &count) < 0 || count <= 0 || count > (c.end - c.pos) / MIN_EVENT)
        Py_RETURN_NONE;
    PyObject *rows = PyList_New((Py_ssize_t)count);
    if (rows == NULL)
        return NULL;
    walk_state w = {.types = types, .server_id = sid};
    int off = 0;
    event e = {0}; /* every field is set before use; zeroed for the compiler's flow analysis */
    for (Py_ssize_t i = 0; i < (Py_ssize_t)count; i++) {
        if (parse_event(&c, &w, i, &e) < 0) {
            off = 1;
            goto fail;
        }
        if (i == 0) { /* the server and session objects every row shares */
            w.server_obj = PyLong_FromLongLong(w.server);
            w.session_obj = PyLong_FromLongLong(w.session);
            if (w.server_obj == NULL || w.session_obj == NULL)
                goto fail;
        }
        PyObject *row = make_row(&w, c.buf, &e, &off);
        if (row == NULL)
            goto fail;
        PyList_SET_ITEM(rows, i, row);
    }
    if (c.pos != c.end) {
        off = 1; /* bytes after the last event */
        goto fail;
    }
    walk_state_clear(&w);
    return rows;
fail:
    walk_state_clear(&w);
    Py_DECREF(rows);
    if (off)
        Py_RETURN_NONE;
    return NULL;
}

static PyMethodDef rows_methods[] = {
    {"walk", rows_walk, METH_VARARGS,
     "walk(data, server_id, types): the merge rows of the MsgEvents `data`, exactly as "
     "rows._walk gives them, or None when anything is off the fast path (then _walk "
     "handles it or raises its ProtocolError). Never adds to `types`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_rows",
    .m_doc = "The Syncer's walk of a received MsgEvents into merge rows.",
    .m_size = -1,
    .m_methods = rows_methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    PyObject *m = PyModule_Create(&rows_module);
    if (m == NULL)
        return NULL;
    /* The timestamp bounds, for the tests to compare with rows.py's. */
    PyObject *min_s = PyLong_FromLongLong(MIN_S), *max_s = PyLong_FromLongLong(MAX_S);
    if (min_s == NULL || max_s == NULL || PyModule_AddObjectRef(m, "MIN_S", min_s) < 0 ||
        PyModule_AddObjectRef(m, "MAX_S", max_s) < 0) {
        Py_XDECREF(min_s);
        Py_XDECREF(max_s);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(min_s);
    Py_DECREF(max_s);
    return m;
}
