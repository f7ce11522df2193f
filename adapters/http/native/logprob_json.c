/* One position of a chat `logprobs.content` list as JSON text, from the per-token templates of
 * adapters/http/logprob_json.py and the position's packed pairs (a CPython extension module,
 * built by `make native`).
 *
 * Why C: in Python a K=20 position took about 8 us on the 2-core box (the values' text, the
 * templates' joins and one `%` format), the largest part of what K=20 adds to a stream's frame.
 * Here it is one pass over the frame's (int32 ID, FP32 bits) pairs as the engine socket
 * delivered them: each value's text is repr's of the widened FP32 value (float_text.h), from
 * the logprob floor up to -1e-4, the wire's text there. A value outside that range, a token
 * without a template yet, or anything unexpected answers None, and the caller takes the Python
 * path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "float_text.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packed positions are little-endian words, read here in place"
#endif

/* domain/logprobs/values.py LOGPROB_FLOOR and domain/common/wire.py REPR_FIXED_FROM. */
#define FLOOR (-9999.0)
#define TOP (-1e-4)

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
    char local[4096];
} Buffer;

/* 0, or -1 with MemoryError set. */
static int append(Buffer *buffer, const char *bytes, Py_ssize_t count)
{
    if (buffer->size + count > buffer->capacity) {
        Py_ssize_t capacity = 2 * (buffer->size + count);
        char *grown;
        if (buffer->data == buffer->local) {
            grown = PyMem_Malloc((size_t)capacity);
            if (grown != NULL) {
                memcpy(grown, buffer->data, (size_t)buffer->size);
            }
        } else {
            grown = PyMem_Realloc(buffer->data, (size_t)capacity);
        }
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        buffer->data = grown;
        buffer->capacity = capacity;
    }
    memcpy(buffer->data + buffer->size, bytes, (size_t)count);
    buffer->size += count;
    return 0;
}

enum { FILLED = 0, FAILED = -1, DECLINED = 1 };

typedef struct {
    const char *start;
    Py_ssize_t length;
} Span;

/* Appends a template as `%` formatting with one value would: `%%` as `%`, its one `%b` as the
 * value's digits. DECLINED for a template of another shape. */
static int fill(Buffer *out, const char *text, Py_ssize_t length, Span digits)
{
    Py_ssize_t at = 0;
    int filled = 0;
    while (at < length) {
        const char *sign = memchr(text + at, '%', (size_t)(length - at));
        if (sign == NULL) {
            return append(out, text + at, length - at) < 0 ? FAILED : (filled ? FILLED : DECLINED);
        }
        Py_ssize_t where = sign - text;
        if (append(out, text + at, where - at) < 0) {
            return FAILED;
        }
        if (where + 1 >= length) {
            return DECLINED;
        }
        if (text[where + 1] == '%') {
            if (append(out, "%", 1) < 0) {
                return FAILED;
            }
        } else if (text[where + 1] == 'b' && !filled) {
            if (append(out, digits.start, digits.length) < 0) {
                return FAILED;
            }
            filled = 1;
        } else {
            return DECLINED;
        }
        at = where + 2;
    }
    return filled ? FILLED : DECLINED;
}

static int fill_template(Buffer *out, PyObject *found, Py_ssize_t skip_head, Py_ssize_t skip_tail,
                         Span digits)
{
    Py_ssize_t length = PyBytes_GET_SIZE(found) - skip_head - skip_tail;
    if (length < 0) {
        return DECLINED;
    }
    return fill(out, PyBytes_AS_STRING(found) + skip_head, length, digits);
}

static const char TOP_LOGPROBS[] = ",\"top_logprobs\":[";

/* The text of a widened FP32 logprob in repr's range; 0 (declined) for any other value. */
static int value_text(double value, char *out)
{
    if (!(value >= FLOOR && value <= TOP)) {
        return 0;
    }
    float narrow = (float)value;
    if ((double)narrow != value) {
        return 0;
    }
    uint32_t bits;
    memcpy(&bits, &narrow, sizeof bits);
    return float_text(bits & 0x7FFFFFFFu, out);
}

/* The template of a token from `by_id` (a list indexed by token ID, None where the memo has no
 * template yet), or NULL for a miss. */
static PyObject *template_at(PyObject *by_id, int32_t token_id)
{
    if (token_id < 0 || token_id >= PyList_GET_SIZE(by_id)) {
        return NULL;
    }
    PyObject *found = PyList_GET_ITEM(by_id, token_id);
    return PyBytes_CheckExact(found) ? found : NULL;
}

/* packed_position(by_id, chosen_id, chosen_value, packed, count) -> bytes | None: the JSON of
 * a position whose alternatives are still the frame's packed words (int32 ID, FP32 bits; the
 * first `count` pairs are shown). */
static PyObject *packed_position(PyObject *module, PyObject *const *args, Py_ssize_t count)
{
    (void)module;
    if (count != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "packed_position takes by_id, chosen_id, chosen_value, packed, count");
        return NULL;
    }
    PyObject *by_id = args[0], *packed = args[3];
    if (!PyList_CheckExact(by_id) || !PyLong_CheckExact(args[1]) || !PyFloat_CheckExact(args[2])
        || !PyBytes_CheckExact(packed)) {
        Py_RETURN_NONE;
    }
    long chosen_id = PyLong_AsLong(args[1]);
    Py_ssize_t shown = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (shown < 0 || 8 * shown > PyBytes_GET_SIZE(packed) || chosen_id > INT32_MAX) {
        Py_RETURN_NONE;
    }
    const char *words = PyBytes_AS_STRING(packed);
    Buffer out;
    out.data = out.local;
    out.size = 0;
    out.capacity = (Py_ssize_t)sizeof(out.local);
    PyObject *result;
    char text[FLOAT_TEXT_MAX];
    Span digits = {text, value_text(PyFloat_AS_DOUBLE(args[2]), text)};
    PyObject *found = template_at(by_id, (int32_t)chosen_id);
    if (found == NULL || digits.length == 0) {
        goto done;
    }
    int status = fill_template(&out, found, 1, 1, digits);
    if (status != FILLED) {
        goto ended;
    }
    if (append(&out, TOP_LOGPROBS, (Py_ssize_t)sizeof(TOP_LOGPROBS) - 1) < 0) {
        goto failed;
    }
    for (Py_ssize_t index = 0; index < shown; index++) {
        int32_t token_id;
        uint32_t bits;
        memcpy(&token_id, words + 8 * index, sizeof token_id);
        memcpy(&bits, words + 8 * index + 4, sizeof bits);
        float value;
        memcpy(&value, &bits, sizeof value);
        digits.length = value_text((double)value, text);
        found = template_at(by_id, token_id);
        if (found == NULL || digits.length == 0) {
            goto done;
        }
        status = fill_template(&out, found, index == 0 ? 1 : 0, 0, digits);
        if (status != FILLED) {
            goto ended;
        }
    }
    if (append(&out, "]}", 2) < 0) {
        goto failed;
    }
    result = PyBytes_FromStringAndSize(out.data, out.size);
    goto freed;
ended:
    if (status == FAILED) {
        goto failed;
    }
done:
    result = Py_NewRef(Py_None);
    goto freed;
failed:
    result = NULL;
freed:
    if (out.data != out.local) {
        PyMem_Free(out.data);
    }
    return result;
}

/* float_text(value) -> bytes | None: the text `packed_position` writes for a value (tests). */
static PyObject *float_text_of(PyObject *module, PyObject *value)
{
    (void)module;
    double number = PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    char text[FLOAT_TEXT_MAX];
    int length = value_text(number, text);
    if (length == 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize(text, length);
}

/* float_texts_disagree(first, last) -> int | None: the first FP32 magnitude bits in
 * [first, last] whose negated value lies in repr's range and whose text differs from
 * float.__repr__'s, or None (tests: whole binades at a time). */
static PyObject *float_texts_disagree(PyObject *module, PyObject *const *args, Py_ssize_t count)
{
    (void)module;
    if (count != 2) {
        PyErr_SetString(PyExc_TypeError, "float_texts_disagree takes first and last bits");
        return NULL;
    }
    unsigned long first = PyLong_AsUnsignedLong(args[0]);
    unsigned long last = PyLong_AsUnsignedLong(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    for (unsigned long bits = first; bits <= last && bits <= 0x7FFFFFFFul; bits++) {
        uint32_t magnitude = (uint32_t)bits;
        float narrow;
        memcpy(&narrow, &magnitude, sizeof narrow);
        double value = -(double)narrow;
        if (!(value >= FLOOR && value <= TOP)) {
            continue;
        }
        char text[FLOAT_TEXT_MAX];
        int length = value_text(value, text);
        char *expected = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (expected == NULL) {
            return NULL;
        }
        int same = length == (int)strlen(expected) && memcmp(text, expected, (size_t)length) == 0;
        PyMem_Free(expected);
        if (!same) {
            return PyLong_FromUnsignedLong(bits);
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"packed_position", (PyCFunction)(void (*)(void))packed_position, METH_FASTCALL,
     "packed_position(by_id, chosen_id, chosen_value, packed, count): the JSON, or None"},
    {"float_text", float_text_of, METH_O, "float_text(value): a logprob's text, or None"},
    {"float_texts_disagree", (PyCFunction)(void (*)(void))float_texts_disagree, METH_FASTCALL,
     "float_texts_disagree(first, last): the first FP32 bits whose text is not repr's"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_logprob_json", "Chat logprob JSON from per-token templates.", -1,
    METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__logprob_json(void)
{
    float_text_init();
    return PyModule_Create(&MODULE);
}
