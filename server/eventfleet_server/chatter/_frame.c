/* The chatter frame's hot pieces in C: the parse of a received ``HatChatter.Msg`` and
 * the head of one we send (connection.py's `parse_msg` / `_parse_head` and
 * `_frame_head`, which stay the reference and the fallback).
 *
 * Why: every Eventer request and answer crosses both. In Python the parse was ~4 µs
 * (four Integer reads, a dict, a keyword call of the namedtuple) and the head ~1.6 µs
 * per message, a fixed cost of every batch-1 registration (docs/performance.md).
 *
 * `parse` returns None for anything off its fast path (an Integer outside int64, bad
 * UTF-8, any inconsistency): the Python parse then reads the message or raises its
 * precise error, so every error message stays in connection.py. `head` returns None
 * for an id or size outside int64; the Python encoder takes those.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../common/sbs_read.h"
#include "../common/sbs_write.h" /* put_uint, nonneg_int64 */

/* The namedtuple classes of connection.py (`setup`): messages are built as theirs. */
static PyObject *msg_cls = NULL;
static PyObject *conv_cls = NULL;

static PyObject *
frame_setup(PyObject *self, PyObject *args)
{
    PyObject *m, *c;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &m, &PyType_Type, &c))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)m, &PyTuple_Type)
        || !PyType_IsSubtype((PyTypeObject *)c, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup() takes two tuple subclasses");
        return NULL;
    }
    Py_INCREF(m);
    Py_INCREF(c);
    Py_XSETREF(msg_cls, m);
    Py_XSETREF(conv_cls, c);
    Py_RETURN_NONE;
}

/* An instance of the tuple subclass `cls` holding `items` (stolen): what the
 * namedtuple's own `_make` does, without its Python-level `__new__`. */
static PyObject *
make(PyObject *cls, PyObject *items)
{
    if (items == NULL)
        return NULL;
    PyObject *args = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (args == NULL)
        return NULL;
    PyObject *obj = PyTuple_Type.tp_new((PyTypeObject *)cls, args, NULL);
    Py_DECREF(args);
    return obj;
}

/* parse(buf, start, end) -> Msg | None: the message encoded in buf[start:end]. */
static PyObject *
frame_parse(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "parse(bytes, start, end)");
        return NULL;
    }
    if (msg_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() was not called");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (start < 0 || end < start || end > size)
        Py_RETURN_NONE;
    cursor c = {(const unsigned char *)PyBytes_AS_STRING(args[0]), start, end};
    int64_t msg_id, first;
    Py_ssize_t n;
    if (read_int(&c, &msg_id) < 0 || read_int(&c, &first) < 0 || c.end - c.pos < 3)
        Py_RETURN_NONE;
    int owner = c.buf[c.pos] != 0;
    int token = c.buf[c.pos + 1] != 0;
    int last = c.buf[c.pos + 2] != 0;
    c.pos += 3;
    if (read_len(&c, &n) < 0)
        Py_RETURN_NONE;
    const unsigned char *type_at = c.buf + c.pos;
    Py_ssize_t type_len = n;
    c.pos += n;
    if (read_len(&c, &n) < 0 || c.pos + n != c.end)
        Py_RETURN_NONE;
    int off = 0;
    PyObject *type = decode_text(type_at, type_len, &off);
    if (type == NULL)
        return off ? Py_NewRef(Py_None) : NULL;
    PyObject *data = PyBytes_FromStringAndSize((const char *)c.buf + c.pos, n);
    PyObject *first_obj = PyLong_FromLongLong(first);
    PyObject *conv = NULL;
    if (data != NULL && first_obj != NULL)
        conv = make(conv_cls, PyTuple_Pack(2, owner ? Py_False : Py_True, first_obj));
    Py_XDECREF(first_obj);
    if (conv == NULL) {
        Py_DECREF(type);
        Py_XDECREF(data);
        return NULL;
    }
    PyObject *items = PyTuple_New(6);
    if (items == NULL) {
        Py_DECREF(type);
        Py_DECREF(data);
        Py_DECREF(conv);
        return NULL;
    }
    PyTuple_SET_ITEM(items, 0, type);
    PyTuple_SET_ITEM(items, 1, data);
    PyTuple_SET_ITEM(items, 2, conv);
    PyTuple_SET_ITEM(items, 3, Py_NewRef(owner && first == msg_id ? Py_True : Py_False));
    PyTuple_SET_ITEM(items, 4, Py_NewRef(last ? Py_True : Py_False));
    PyTuple_SET_ITEM(items, 5, Py_NewRef(token ? Py_True : Py_False));
    return make(msg_cls, items);
}

/* head(msg_id, first, owner, token, last, encoded_type, size) -> bytes | None: the
 * frame's length prefix and the message up to its payload (`_frame_head`). */
static PyObject *
frame_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "head(msg_id, first, owner, token, last, encoded_type: bytes, size)");
        return NULL;
    }
    int64_t msg_id = nonneg_int64(args[0]);
    int64_t first = nonneg_int64(args[1]);
    int64_t size = nonneg_int64(args[6]);
    if (msg_id < 0 || first < 0 || size < 0)
        Py_RETURN_NONE;
    int flags[3];
    for (int i = 0; i < 3; i++) {
        flags[i] = PyObject_IsTrue(args[2 + i]);
        if (flags[i] < 0)
            return NULL;
    }
    Py_ssize_t type_len = PyBytes_GET_SIZE(args[5]);
    if (type_len > 4096) /* a type name, not a payload: the Python path takes it */
        Py_RETURN_NONE;
    unsigned char body[10 + 10 + 3 + 4096 + 10];
    int pos = put_uint(body, (uint64_t)msg_id);
    pos += put_uint(body + pos, (uint64_t)first);
    body[pos++] = flags[0];
    body[pos++] = flags[1];
    body[pos++] = flags[2];
    memcpy(body + pos, PyBytes_AS_STRING(args[5]), type_len);
    pos += type_len;
    pos += put_uint(body + pos, (uint64_t)size);
    if ((uint64_t)size > UINT64_MAX - (uint64_t)pos)
        Py_RETURN_NONE;
    uint64_t total = (uint64_t)size + pos;
    unsigned char prefix[9];
    int k = 0;
    for (uint64_t t = total; t; t >>= 8)
        k++;
    if (k == 0)
        k = 1;
    prefix[0] = (unsigned char)k;
    for (int i = 0; i < k; i++)
        prefix[k - i] = (unsigned char)(total >> (8 * i));
    PyObject *out = PyBytes_FromStringAndSize(NULL, 1 + k + pos);
    if (out == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, prefix, 1 + k);
    memcpy(o + 1 + k, body, pos);
    return out;
}

static PyMethodDef methods[] = {
    {"setup", frame_setup, METH_VARARGS,
     "setup(Msg, Conversation): the namedtuple classes parse() builds."},
    {"parse", (PyCFunction)(void (*)(void))frame_parse, METH_FASTCALL,
     "parse(buf, start, end) -> Msg | None: the HatChatter.Msg in buf[start:end], or None "
     "when the Python parse must judge it."},
    {"head", (PyCFunction)(void (*)(void))frame_head, METH_FASTCALL,
     "head(msg_id, first, owner, token, last, encoded_type, size) -> bytes | None: a "
     "frame's length prefix and message up to its payload of `size` bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frame",
    "C parse and head of chatter frames (see connection.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__frame(void)
{
    return PyModule_Create(&module);
}
