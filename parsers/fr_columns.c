/* A Flight Recorder pickle read straight into columns, never executed (optional; see fr_columns.pyi).
 *
 * Why compiled: reading a 2,000-entry dump through Python objects (the restricted unpickler, then the
 * entries' dicts transposed into Arrow arrays, then freeing them) costs ~25 ms of CPU, against ~14 ms a dump
 * for the whole 4,096-rank analysis of issue #26 (docs/performance.md). This reader makes no Python object per
 * entry: the opcodes build a tree of plain C nodes, the entries' flat fields become typed buffers (int64,
 * float64, bit-packed bools, dictionary-encoded strings) and their shape fields (group, operation, sizes,
 * dtypes, stack) a key per entry, deduplicated; only the top-level fields and one value per distinct shape
 * become Python objects.
 *
 * Safety: the same data-only allowlist and caps as fr_pickle.scan (size, MARK nesting, every length field),
 * every read bounds-checked. There is no opcode that names or calls anything. Anything it does not read
 * exactly as the Python reader would (an opcode outside the allowlist, a cap, a type it does not expect, a
 * memo index never set, deep nesting) is a refusal: it returns a short reason (str) and the caller reads the
 * dump with the Python reader, which words the exact message. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DUMP_BYTES (64LL << 20)
#define MAX_STRING_BYTES (1LL << 20)
#define MAX_DEPTH 12
#define MAX_TREE_DEPTH 48

enum { T_NONE, T_TRUE, T_FALSE, T_INT, T_FLOAT, T_STR, T_BYTES, T_LIST, T_TUPLE, T_DICT };

typedef struct {
    int64_t v;      /* INT value, FLOAT bits, STR/BYTES offset */
    uint32_t len;   /* STR/BYTES length */
    int32_t head, tail, count; /* containers: edge list (dicts: key, value, key, value ...) */
    uint8_t t;
    int8_t field;   /* a key string's field (memoized strings are one node: looked up once); -3 not yet */
    int16_t col;    /* a text value's column, +1 (0: none yet), and its row of that column's dictionary: */
    int32_t code;   /* the same string node in the same column is not hashed again */
} Node;

typedef struct { int32_t node, next; } Edge;

typedef struct {
    const uint8_t *d;
    Py_ssize_t n;
    Node *nodes; int32_t nn, cn;
    Edge *edges; int32_t ne, ce;
    int32_t *stack; int32_t sp, cs;
    int32_t marks[MAX_DEPTH + 1]; int depth;
    int32_t *memo; int64_t cm; int64_t memo_count;
    char why[160];
} R;

static int fail(R *r, const char *fmt, Py_ssize_t at) {
    if (!r->why[0]) PyOS_snprintf(r->why, sizeof r->why, fmt, (long long)at);
    return -1;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    if (c > INT32_MAX) return -1;
    void *q = PyMem_Realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q; *cap = (int32_t)c;
    return 0;
}

static int32_t node(R *r, uint8_t t) {
    if (grow((void **)&r->nodes, &r->cn, r->nn + 1, sizeof(Node))) return -1;
    Node *x = &r->nodes[r->nn];
    memset(x, 0, sizeof *x);
    x->t = t; x->head = x->tail = -1; x->field = -3;
    return r->nn++;
}

static int add_child(R *r, int32_t parent, int32_t child) {
    if (grow((void **)&r->edges, &r->ce, r->ne + 1, sizeof(Edge))) return -1;
    Edge *e = &r->edges[r->ne];
    e->node = child; e->next = -1;
    Node *p = &r->nodes[parent];
    if (p->tail >= 0) r->edges[p->tail].next = r->ne; else p->head = r->ne;
    p->tail = r->ne++;
    p->count++;
    return 0;
}

static int push(R *r, int32_t x) {
    if (x < 0 || grow((void **)&r->stack, &r->cs, r->sp + 1, sizeof(int32_t))) return -1;
    r->stack[r->sp++] = x;
    return 0;
}

static int32_t fence(R *r) { return r->depth ? r->marks[r->depth - 1] : 0; }

static int need(R *r, Py_ssize_t pos, Py_ssize_t k) { return pos + k <= r->n; }

static uint64_t le(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int memo_put(R *r, int64_t idx, Py_ssize_t at) {
    if (r->sp <= fence(r)) return fail(r, "memo put of nothing at offset %lld", at);
    if (idx < 0 || idx > r->n) return fail(r, "memo index out of range at offset %lld", at);
    if (idx >= r->cm) {
        int64_t c = r->cm ? r->cm : 256;
        while (c <= idx) c *= 2;
        int32_t *q = PyMem_Realloc(r->memo, (size_t)c * sizeof(int32_t));
        if (!q) return fail(r, "out of memory at offset %lld", at);
        for (int64_t i = r->cm; i < c; i++) q[i] = -1;
        r->memo = q; r->cm = c;
    }
    if (r->memo[idx] < 0) r->memo_count++;
    r->memo[idx] = r->stack[r->sp - 1];
    return 0;
}

static int memo_get(R *r, int64_t idx, Py_ssize_t at) {
    if (idx < 0 || idx >= r->cm || r->memo[idx] < 0) return fail(r, "memo index never set at offset %lld", at);
    return push(r, r->memo[idx]) ? fail(r, "out of memory at offset %lld", at) : 0;
}

static int scalar(R *r, uint8_t t, int64_t v) {
    int32_t x = node(r, t);
    if (x < 0) return -1;
    r->nodes[x].v = v;
    return push(r, x);
}

/* Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF): every string is checked once, where it
 * is read, as Python's unpickler decodes every string (it also takes surrogates: those are refused here). */
static int utf8(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        int k = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (k < 0 || i + k >= n) return 0; /* not a lead byte, or its sequence runs past the string */
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (int j = 2; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

static int text(R *r, uint8_t t, Py_ssize_t pos, int width, Py_ssize_t *next) {
    if (!need(r, pos, width)) return fail(r, "length field past the end at offset %lld", pos);
    uint64_t len = le(r->d + pos, width);
    if (len > MAX_STRING_BYTES) return fail(r, "string above the cap at offset %lld", pos);
    if (!need(r, pos + width, (Py_ssize_t)len)) return fail(r, "string past the end at offset %lld", pos);
    if (t == T_STR && !utf8(r->d + pos + width, (Py_ssize_t)len))
        return fail(r, "a string that is not strict UTF-8 at offset %lld", pos);
    int32_t x = node(r, t);
    if (x < 0) return -1;
    r->nodes[x].v = pos + width;
    r->nodes[x].len = (uint32_t)len;
    *next = pos + width + (Py_ssize_t)len;
    return push(r, x);
}

/* A new container of the items above the top mark (TUPLE, LIST, DICT) */
static int collect(R *r, uint8_t t, Py_ssize_t at) {
    if (!r->depth) return fail(r, "closer without MARK at offset %lld", at);
    int32_t lo = r->marks[--r->depth];
    if (t == T_DICT && (r->sp - lo) % 2) return fail(r, "odd DICT at offset %lld", at);
    int32_t x = node(r, t);
    if (x < 0) return -1;
    for (int32_t i = lo; i < r->sp; i++)
        if (add_child(r, x, r->stack[i])) return -1;
    r->sp = lo;
    return push(r, x);
}

/* APPENDS / SETITEMS: the items above the top mark go into the container below it */
static int extend(R *r, uint8_t t, Py_ssize_t at) {
    if (!r->depth) return fail(r, "closer without MARK at offset %lld", at);
    int32_t lo = r->marks[--r->depth];
    if (lo <= fence(r) || r->nodes[r->stack[lo - 1]].t != t) return fail(r, "APPENDS/SETITEMS target at offset %lld", at);
    if (t == T_DICT && (r->sp - lo) % 2) return fail(r, "odd SETITEMS at offset %lld", at);
    int32_t x = r->stack[lo - 1];
    for (int32_t i = lo; i < r->sp; i++)
        if (add_child(r, x, r->stack[i])) return -1;
    r->sp = lo;
    return 0;
}

static int small_tuple(R *r, int k, Py_ssize_t at) {
    if (r->sp - fence(r) < k) return fail(r, "TUPLE of too few items at offset %lld", at);
    int32_t x = node(r, T_TUPLE);
    if (x < 0) return -1;
    for (int32_t i = r->sp - k; i < r->sp; i++)
        if (add_child(r, x, r->stack[i])) return -1;
    r->sp -= k;
    return push(r, x);
}

static int one_item(R *r, uint8_t t, Py_ssize_t at) { /* APPEND, SETITEM */
    int k = t == T_LIST ? 1 : 2;
    if (r->sp - fence(r) < k + 1 || r->nodes[r->stack[r->sp - k - 1]].t != t)
        return fail(r, "APPEND/SETITEM target at offset %lld", at);
    int32_t x = r->stack[r->sp - k - 1];
    for (int32_t i = r->sp - k; i < r->sp; i++)
        if (add_child(r, x, r->stack[i])) return -1;
    r->sp -= k;
    return 0;
}

/* One opcode at pos; the next position in *next. 1: STOP read. */
static int step(R *r, Py_ssize_t pos, Py_ssize_t *next) {
    uint8_t op = r->d[pos];
    Py_ssize_t p = pos + 1;
    const uint8_t *d = r->d;
    *next = p;
    switch (op) {
    case 'h': if (!need(r, p, 1)) break; *next = p + 1; return memo_get(r, d[p], pos);
    case 'j': if (!need(r, p, 4)) break; *next = p + 4; return memo_get(r, (int64_t)le(d + p, 4), pos);
    case 'q': if (!need(r, p, 1)) break; *next = p + 1; return memo_put(r, d[p], pos);
    case 'r': if (!need(r, p, 4)) break; *next = p + 4; return memo_put(r, (int64_t)le(d + p, 4), pos);
    case 0x94: return memo_put(r, r->memo_count, pos);
    case 'K': if (!need(r, p, 1)) break; *next = p + 1; return scalar(r, T_INT, d[p]);
    case 'M': if (!need(r, p, 2)) break; *next = p + 2; return scalar(r, T_INT, (int64_t)le(d + p, 2));
    case 'J': if (!need(r, p, 4)) break; *next = p + 4; return scalar(r, T_INT, (int32_t)(uint32_t)le(d + p, 4));
    case 0x8a: {
        if (!need(r, p, 1)) break;
        int k = d[p];
        if (k > 8) return fail(r, "LONG1 wider than 8 bytes at offset %lld", pos);
        if (!need(r, p + 1, k)) break;
        uint64_t u = le(d + p + 1, k);
        if (k && k < 8 && (d[p + k] & 0x80)) u |= ~0ULL << (8 * k); /* sign-extend */
        *next = p + 1 + k;
        return scalar(r, T_INT, (int64_t)u);
    }
    case 'G': {
        if (!need(r, p, 8)) break;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = (u << 8) | d[p + i]; /* big-endian */
        *next = p + 8;
        return scalar(r, T_FLOAT, (int64_t)u);
    }
    case 'N': return scalar(r, T_NONE, 0);
    case 0x88: return scalar(r, T_TRUE, 0);
    case 0x89: return scalar(r, T_FALSE, 0);
    case ']': return push(r, node(r, T_LIST));
    case '}': return push(r, node(r, T_DICT));
    case ')': return push(r, node(r, T_TUPLE));
    case 'X': return text(r, T_STR, p, 4, next);
    case 0x8c: return text(r, T_STR, p, 1, next);
    case 'B': return text(r, T_BYTES, p, 4, next);
    case 'C': return text(r, T_BYTES, p, 1, next);
    case '(':
        if (r->depth + 1 > MAX_DEPTH) return fail(r, "MARKs nested deeper than the cap at offset %lld", pos);
        r->marks[r->depth++] = r->sp;
        return 0;
    case 'a': return one_item(r, T_LIST, pos);
    case 's': return one_item(r, T_DICT, pos);
    case 'e': return extend(r, T_LIST, pos);
    case 'u': return extend(r, T_DICT, pos);
    case 't': return collect(r, T_TUPLE, pos);
    case 'l': return collect(r, T_LIST, pos);
    case 'd': return collect(r, T_DICT, pos);
    case 0x85: return small_tuple(r, 1, pos);
    case 0x86: return small_tuple(r, 2, pos);
    case 0x87: return small_tuple(r, 3, pos);
    case 0x95: {
        if (!need(r, p, 8)) break;
        uint64_t len = le(d + p, 8);
        if (len > (uint64_t)(r->n - p - 8)) return fail(r, "FRAME past the end at offset %lld", pos);
        *next = p + 8;
        return 0;
    }
    case '.':
        if (p != r->n || r->depth || r->sp != 1) return fail(r, "STOP not at the end of one value at offset %lld", pos);
        return 1;
    default:
        return fail(r, "opcode outside the allowlist at offset %lld", pos);
    }
    return fail(r, "truncated opcode at offset %lld", pos);
}

static int run(R *r) {
    if (r->n > MAX_DUMP_BYTES) return fail(r, "above the size cap (%lld bytes)", r->n);
    if (r->n < 3 || r->d[0] != 0x80 || r->d[1] < 2 || r->d[1] > 5) return fail(r, "no PROTO 2-5 (%lld)", 0);
    Py_ssize_t pos = 2, next;
    while (pos < r->n) {
        int got = step(r, pos, &next);
        if (got < 0) return fail(r, "out of memory at offset %lld", pos);
        if (got == 1) return 0;
        pos = next;
    }
    return fail(r, "no STOP before the end (%lld bytes)", r->n);
}

/* --- nodes to Python (the top level, and one value per distinct shape) ------------------------------- */

static PyObject *py(R *r, int32_t x, int depth) {
    if (depth > MAX_TREE_DEPTH) { fail(r, "nested deeper than %lld", MAX_TREE_DEPTH); return NULL; }
    Node *n = &r->nodes[x];
    switch (n->t) {
    case T_NONE: Py_RETURN_NONE;
    case T_TRUE: Py_RETURN_TRUE;
    case T_FALSE: Py_RETURN_FALSE;
    case T_INT: return PyLong_FromLongLong(n->v);
    case T_FLOAT: { double f; memcpy(&f, &n->v, 8); return PyFloat_FromDouble(f); }
    case T_STR: {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)r->d + n->v, n->len, NULL);
        if (!s) { PyErr_Clear(); fail(r, "a string that is not UTF-8 at offset %lld", n->v); }
        return s;
    }
    case T_BYTES: return PyBytes_FromStringAndSize((const char *)r->d + n->v, n->len);
    default: break;
    }
    int32_t count = n->count, e = n->head;
    PyObject *out = n->t == T_LIST ? PyList_New(count) : n->t == T_TUPLE ? PyTuple_New(count) : PyDict_New();
    if (!out) return NULL;
    for (int32_t i = 0; e >= 0; i++, e = r->edges[e].next) {
        PyObject *v = py(r, r->edges[e].node, depth + 1);
        if (!v) { Py_DECREF(out); return NULL; }
        if (n->t == T_LIST) { PyList_SET_ITEM(out, i, v); continue; }
        if (n->t == T_TUPLE) { PyTuple_SET_ITEM(out, i, v); continue; }
        e = r->edges[e].next; /* the value of this key */
        PyObject *val = py(r, r->edges[e].node, depth + 1);
        int bad = !val || PyDict_SetItem(out, v, val) < 0;
        Py_DECREF(v); Py_XDECREF(val);
        if (bad) { PyErr_Clear(); fail(r, "a dict key that is not hashable (%lld)", 0); Py_DECREF(out); return NULL; }
    }
    return out;
}

static int is_str(R *r, int32_t x, const char *s) {
    Node *n = &r->nodes[x];
    size_t len = strlen(s);
    return n->t == T_STR && n->len == len && memcmp(r->d + n->v, s, len) == 0;
}

/* --- growable byte buffers, hash of byte strings ----------------------------------------------------- */

typedef struct { char *p; Py_ssize_t n, cap; } Buf;

static int put(Buf *b, const void *src, Py_ssize_t k) {
    if (b->n + k > b->cap) {
        Py_ssize_t c = b->cap ? b->cap : 256;
        while (c < b->n + k) c *= 2;
        char *q = PyMem_Realloc(b->p, c);
        if (!q) return -1;
        b->p = q; b->cap = c;
    }
    memcpy(b->p + b->n, src, k);
    b->n += k;
    return 0;
}

static uint64_t fnv(const char *p, Py_ssize_t k) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < k; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ULL;
    return h;
}

/* Distinct byte strings: their bytes one after the other in `all`, offsets in `at` (count + 1) */
typedef struct { Buf all; Py_ssize_t *at; int32_t count, cap; int32_t *slot; int32_t nslot; } Set;

static int32_t set_add(Set *s, const char *p, Py_ssize_t k) {
    if (!s->nslot || 2 * (s->count + 1) > s->nslot) {
        int32_t ns = s->nslot ? 2 * s->nslot : 64;
        int32_t *q = PyMem_Malloc(ns * sizeof(int32_t));
        if (!q) return -1;
        for (int32_t i = 0; i < ns; i++) q[i] = -1;
        for (int32_t i = 0; i < s->count; i++) {
            uint64_t h = fnv(s->all.p + s->at[i], s->at[i + 1] - s->at[i]) & (ns - 1);
            while (q[h] >= 0) h = (h + 1) & (ns - 1);
            q[h] = i;
        }
        PyMem_Free(s->slot);
        s->slot = q; s->nslot = ns;
    }
    uint64_t h = fnv(p, k) & (s->nslot - 1);
    for (; s->slot[h] >= 0; h = (h + 1) & (s->nslot - 1)) {
        int32_t i = s->slot[h];
        if (s->at[i + 1] - s->at[i] == k && memcmp(s->all.p + s->at[i], p, k) == 0) return i;
    }
    if (s->count + 2 > s->cap) {
        int32_t c = s->cap ? 2 * s->cap : 64;
        Py_ssize_t *q = PyMem_Realloc(s->at, c * sizeof(Py_ssize_t));
        if (!q) return -1;
        s->at = q; s->cap = c;
    }
    if (!s->count) s->at[0] = 0;
    if (put(&s->all, p, k)) return -1;
    s->at[s->count + 1] = s->all.n;
    s->slot[h] = s->count;
    return s->count++;
}

static void set_free(Set *s) { PyMem_Free(s->all.p); PyMem_Free(s->at); PyMem_Free(s->slot); }

/* A value's exact serialisation (type tags, values): entries with equal keys have equal shape values */
static int ser(R *r, Buf *b, int32_t x, int depth) {
    if (depth > MAX_TREE_DEPTH) return fail(r, "a shape nested deeper than %lld", MAX_TREE_DEPTH);
    Node *n = &r->nodes[x];
    uint8_t t = n->t;
    if (put(b, &t, 1)) return -1;
    switch (t) {
    case T_INT: case T_FLOAT: return put(b, &n->v, 8);
    case T_STR: case T_BYTES: return put(b, &n->len, 4) || put(b, r->d + n->v, n->len) ? -1 : 0;
    case T_LIST: case T_TUPLE: case T_DICT:
        if (put(b, &n->count, 4)) return -1;
        for (int32_t e = n->head; e >= 0; e = r->edges[e].next)
            if (ser(r, b, r->edges[e].node, depth + 1)) return -1;
        return 0;
    default: return 0;
    }
}

/* --- the entries ------------------------------------------------------------------------------------- */

enum { K_INT, K_FLOAT, K_STR, K_BOOL };

typedef struct {
    const char *name; int kind;
    Buf vals, valid; Py_ssize_t nulls; Set dict;
} Col;

typedef struct { Col *cols; int ncols; const char **shape; int nshape; } Fields;

static int bit(Buf *b, Py_ssize_t i, int on) {
    if (i % 8 == 0) { uint8_t z = 0; if (put(b, &z, 1)) return -1; }
    if (on) b->p[i / 8] |= (char)(1 << (i % 8));
    return 0;
}

/* One entry's value of a flat field; absent (-1) and None are null. Another type: refused. */
static int cell(R *r, Col *c, int col, int32_t x, Py_ssize_t i) {
    Node *n = x >= 0 ? &r->nodes[x] : NULL;
    int null = !n || n->t == T_NONE;
    if (bit(&c->valid, i, !null)) return -1;
    c->nulls += null;
    int64_t zero = 0;
    switch (c->kind) {
    case K_INT:
        if (!null && n->t != T_INT) return fail(r, "an entry's integer field of another type (entry %lld)", i);
        return put(&c->vals, null ? &zero : &n->v, 8);
    case K_FLOAT:
        if (!null && n->t != T_FLOAT) return fail(r, "an entry's float field of another type (entry %lld)", i);
        return put(&c->vals, null ? &zero : &n->v, 8);
    case K_BOOL:
        if (!null && n->t != T_TRUE && n->t != T_FALSE)
            return fail(r, "an entry's bool field of another type (entry %lld)", i);
        return bit(&c->vals, i, !null && n->t == T_TRUE);
    default: {
        int32_t k = 0;
        if (!null) {
            if (n->t != T_STR) return fail(r, "an entry's text field of another type (entry %lld)", i);
            if (n->col == col + 1) {
                k = n->code;
            } else {
                k = set_add(&c->dict, (const char *)r->d + n->v, n->len);
                if (k < 0) return -1;
                n->col = (int16_t)(col + 1); n->code = k;
            }
        }
        return put(&c->vals, &k, 4);
    }
    }
}

static int field_of(R *r, Fields *f, int32_t key) {
    Node *n = &r->nodes[key];
    if (n->t != T_STR) return -2;
    if (n->field != -3) return n->field;
    n->field = -1;
    for (int i = 0; i < f->ncols + f->nshape; i++) {
        const char *name = i < f->ncols ? f->cols[i].name : f->shape[i - f->ncols];
        if (strlen(name) == n->len && memcmp(r->d + n->v, name, n->len) == 0) { n->field = (int8_t)i; break; }
    }
    return n->field;
}

/* Each entry: its flat cells, then its shape key; slot[i]: the node of field i (-1 absent) */
static int entry(R *r, Fields *f, int32_t x, Py_ssize_t i, int32_t *slot, Buf *key, Set *shapes, Buf *idx,
                 int32_t *first) {
    Node *n = &r->nodes[x];
    if (n->t != T_DICT) return fail(r, "an entry that is not a dict (entry %lld)", i);
    int nf = f->ncols + f->nshape;
    for (int k = 0; k < nf; k++) slot[k] = -1;
    for (int32_t e = n->head; e >= 0; e = r->edges[r->edges[e].next].next) {
        int32_t kn = r->edges[e].node;
        int k = field_of(r, f, kn);
        uint8_t kt = r->nodes[kn].t;
        if (kt == T_LIST || kt == T_DICT || kt == T_TUPLE) return fail(r, "a container as an entry key (%lld)", i);
        if (k >= 0) slot[k] = r->edges[r->edges[e].next].node; /* the last of repeated keys wins, as in a dict */
    }
    for (int k = 0; k < f->ncols; k++)
        if (cell(r, &f->cols[k], k, slot[k], i)) return -1;
    key->n = 0;
    for (int k = f->ncols; k < nf; k++) {
        if (slot[k] < 0) { uint8_t t = T_NONE; if (put(key, &t, 1)) return -1; continue; } /* absent = None */
        if (ser(r, key, slot[k], 0)) return -1;
    }
    int32_t before = shapes->count;
    int32_t s = set_add(shapes, key->p, key->n);
    if (s < 0) return -1;
    if (s == before) first[s] = x;
    return put(idx, &s, 4);
}

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", b->n); }

static PyObject *column(Col *c) {
    PyObject *vals = bytes_of(&c->vals);
    PyObject *valid = c->nulls ? bytes_of(&c->valid) : (Py_INCREF(Py_None), Py_None);
    PyObject *dict = NULL;
    if (c->kind == K_STR) {
        dict = PyList_New(c->dict.count);
        for (int32_t i = 0; dict && i < c->dict.count; i++) {
            PyObject *s = PyUnicode_DecodeUTF8(c->dict.all.p + c->dict.at[i], c->dict.at[i + 1] - c->dict.at[i], NULL);
            if (!s) { Py_CLEAR(dict); break; }
            PyList_SET_ITEM(dict, i, s);
        }
    } else {
        dict = Py_None; Py_INCREF(dict);
    }
    PyObject *out = vals && valid && dict ? Py_BuildValue("(OOO)", vals, valid, dict) : NULL;
    Py_XDECREF(vals); Py_XDECREF(valid); Py_XDECREF(dict);
    return out;
}

/* The distinct shapes: keys (bytes), each one's values as a tuple when it is not in `known`, its process group */
static PyObject *shape_values(R *r, Fields *f, Set *shapes, int32_t *first, PyObject *known, int32_t *slot) {
    PyObject *keys = PyList_New(shapes->count), *new = PyDict_New(), *names = PyList_New(shapes->count);
    if (!keys || !new || !names) goto bad;
    for (int32_t s = 0; s < shapes->count; s++) {
        Py_ssize_t a = shapes->at[s], b = shapes->at[s + 1];
        PyObject *key = PyBytes_FromStringAndSize(NULL, b - a + 2);
        if (!key) goto bad;
        memcpy(PyBytes_AS_STRING(key), "\0C", 2);
        memcpy(PyBytes_AS_STRING(key) + 2, shapes->all.p + a, b - a);
        PyList_SET_ITEM(keys, s, key);
        /* the slots of this shape's first entry */
        Node *n = &r->nodes[first[s]];
        int nf = f->ncols + f->nshape;
        for (int k = 0; k < nf; k++) slot[k] = -1;
        for (int32_t e = n->head; e >= 0; e = r->edges[r->edges[e].next].next) {
            int k = field_of(r, f, r->edges[e].node);
            if (k >= 0) slot[k] = r->edges[r->edges[e].next].node;
        }
        int32_t pg = slot[f->ncols]; /* process_group is the first shape field */
        PyObject *name = pg >= 0 ? py(r, pg, 1) : (Py_INCREF(Py_None), Py_None);
        if (!name) goto bad;
        PyList_SET_ITEM(names, s, name);
        int in = PySequence_Contains(known, key);
        if (in < 0) goto bad;
        if (in) continue;
        PyObject *t = PyTuple_New(f->nshape);
        if (!t) goto bad;
        for (int k = 0; k < f->nshape; k++) {
            int32_t v = slot[f->ncols + k];
            PyObject *o = v >= 0 ? py(r, v, 1) : (Py_INCREF(Py_None), Py_None);
            if (!o) { Py_DECREF(t); goto bad; }
            PyTuple_SET_ITEM(t, k, o);
        }
        int bad = PyDict_SetItem(new, key, t) < 0;
        Py_DECREF(t);
        if (bad) goto bad;
    }
    return Py_BuildValue("(NNN)", keys, new, names);
bad:
    Py_XDECREF(keys); Py_XDECREF(new); Py_XDECREF(names);
    return NULL;
}

static int field_names(PyObject *seq, const char ***out, int *n) {
    PyObject *fast = PySequence_Fast(seq, "fields must be a sequence");
    if (!fast) return -1;
    *n = (int)PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc(*n + 1, sizeof(char *));
    for (int i = 0; *out && i < *n; i++) {
        (*out)[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (!(*out)[i]) { Py_DECREF(fast); return -1; }
    }
    Py_DECREF(fast); /* the names stay alive in the caller's tuples */
    return *out ? 0 : -1;
}

static PyObject *entries_of(R *r, Fields *f, int32_t list, PyObject *known) {
    Py_ssize_t n = r->nodes[list].count;
    int nf = f->ncols + f->nshape;
    int32_t *slot = PyMem_Malloc(nf * sizeof(int32_t)), *first = PyMem_Malloc((n + 1) * sizeof(int32_t));
    Buf key = {0}, idx = {0};
    Set shapes = {0};
    PyObject *out = NULL, *cols = NULL, *sv = NULL;
    if (!slot || !first) goto done;
    Py_ssize_t i = 0;
    for (int32_t e = r->nodes[list].head; e >= 0; e = r->edges[e].next, i++)
        if (entry(r, f, r->edges[e].node, i, slot, &key, &shapes, &idx, first)) goto done;
    cols = PyDict_New();
    for (int k = 0; cols && k < f->ncols; k++) {
        PyObject *c = column(&f->cols[k]);
        if (!c || PyDict_SetItemString(cols, f->cols[k].name, c) < 0) { Py_XDECREF(c); Py_CLEAR(cols); break; }
        Py_DECREF(c);
    }
    if (!cols) goto done;
    sv = shape_values(r, f, &shapes, first, known, slot);
    if (!sv) goto done;
    out = Py_BuildValue("(nOOO)", n, cols, sv, bytes_of(&idx));
    if (out) Py_DECREF(PyTuple_GET_ITEM(out, 3)); /* Py_BuildValue took its own reference */
done:
    Py_XDECREF(cols); Py_XDECREF(sv);
    PyMem_Free(slot); PyMem_Free(first); PyMem_Free(key.p); PyMem_Free(idx.p); set_free(&shapes);
    return out;
}

static PyObject *read_top(R *r, Fields *f, PyObject *known) {
    int32_t top = r->stack[0];
    if (r->nodes[top].t != T_DICT) { fail(r, "the top level is not a dict (%lld)", 0); return NULL; }
    int32_t list = -1;
    PyObject *doc = PyDict_New();
    if (!doc) return NULL;
    for (int32_t e = r->nodes[top].head; e >= 0; e = r->edges[r->edges[e].next].next) {
        int32_t k = r->edges[e].node, v = r->edges[r->edges[e].next].node;
        if (is_str(r, k, "entries")) { list = v; continue; } /* the last one wins, as in a dict */
        PyObject *pk = py(r, k, 1), *pv = pk ? py(r, v, 1) : NULL;
        int bad = !pv || PyDict_SetItem(doc, pk, pv) < 0;
        Py_XDECREF(pk); Py_XDECREF(pv);
        if (bad) { PyErr_Clear(); fail(r, "a top-level key or value it cannot read (%lld)", 0); Py_DECREF(doc); return NULL; }
    }
    if (list >= 0 && r->nodes[list].t == T_NONE) list = -1;
    if (list >= 0 && r->nodes[list].t != T_LIST) { fail(r, "entries is not a list (%lld)", 0); Py_DECREF(doc); return NULL; }
    if (list < 0 || !r->nodes[list].count) return Py_BuildValue("(NO)", doc, Py_None);
    PyObject *got = entries_of(r, f, list, known);
    if (!got) { Py_DECREF(doc); return NULL; }
    return Py_BuildValue("(NN)", doc, got);
}

static int kind_of(const char *k) {
    return k[0] == 'i' ? K_INT : k[0] == 'f' ? K_FLOAT : k[0] == 'b' ? K_BOOL : K_STR;
}

/* The tree's arrays are kept from one call to the next (the GIL is held throughout a call): a fresh 5 MB a dump
 * cost as much in page faults and copies while growing as the reading itself. Above KEEP_BYTES they are freed. */
#define KEEP_BYTES (64 << 20)
static R kept;

static void keep(R *r) {
    int big = (size_t)r->cn * sizeof(Node) + (size_t)r->ce * sizeof(Edge) > KEEP_BYTES || r->cm > (KEEP_BYTES >> 2);
    /* kept.nodes set: another call ran meanwhile (a thread switch while this one made Python objects) */
    if (big || kept.nodes || kept.edges || kept.stack || kept.memo) {
        PyMem_Free(r->nodes); PyMem_Free(r->edges); PyMem_Free(r->stack); PyMem_Free(r->memo);
        return;
    }
    kept.nodes = r->nodes; kept.cn = r->cn; kept.edges = r->edges; kept.ce = r->ce;
    kept.stack = r->stack; kept.cs = r->cs; kept.memo = r->memo; kept.cm = r->cm;
}

static PyObject *fr_read(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    PyObject *flat, *shape, *known;
    if (!PyArg_ParseTuple(args, "y*OOO", &data, &flat, &shape, &known)) return NULL;
    R r = {0};
    r.nodes = kept.nodes; r.cn = kept.cn; r.edges = kept.edges; r.ce = kept.ce;
    r.stack = kept.stack; r.cs = kept.cs; r.memo = kept.memo; r.cm = kept.cm;
    memset(&kept, 0, sizeof kept); /* taken: a call made from inside this one (none is) would start afresh */
    for (int64_t i = 0; i < r.cm; i++) r.memo[i] = -1;
    r.d = data.buf; r.n = data.len;
    Fields f = {0};
    const char **flat_spec = NULL;
    int nflat = 0;
    PyObject *out = NULL;
    if (field_names(flat, &flat_spec, &nflat) || field_names(shape, &f.shape, &f.nshape)) goto done;
    f.cols = PyMem_Calloc(nflat + 1, sizeof(Col));
    if (!f.cols) goto done;
    f.ncols = nflat;
    for (int i = 0; i < nflat; i++) { /* "name:kind" with kind i (int64), f (float64), b (bool), s (text) */
        const char *colon = strchr(flat_spec[i], ':');
        if (!colon) { PyErr_SetString(PyExc_ValueError, "flat fields are 'name:kind'"); goto done; }
        f.cols[i].name = PyMem_Calloc(colon - flat_spec[i] + 1, 1);
        if (!f.cols[i].name) goto done;
        memcpy((char *)f.cols[i].name, flat_spec[i], colon - flat_spec[i]);
        f.cols[i].kind = kind_of(colon + 1);
    }
    if (run(&r) == 0) out = read_top(&r, &f, known);
    if (!out && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) goto done; /* raised, as the Python reader would */
        PyErr_Clear(); /* e.g. a dictionary string that is not UTF-8: the Python reader decides */
        fail(&r, "a value it cannot convert (%lld)", 0);
    }
    if (!out) out = PyUnicode_FromString(r.why[0] ? r.why : "refused");
done:
    for (int i = 0; f.cols && i < nflat; i++) {
        PyMem_Free((void *)f.cols[i].name);
        PyMem_Free(f.cols[i].vals.p); PyMem_Free(f.cols[i].valid.p); set_free(&f.cols[i].dict);
    }
    PyMem_Free(f.cols); PyMem_Free(flat_spec); PyMem_Free(f.shape);
    keep(&r);
    PyBuffer_Release(&data);
    return out;
}

static PyMethodDef methods[] = {
    {"read", fr_read, METH_VARARGS,
     "read(data, flat, shape, known) -> (doc, entries | None) | str: see fr_columns.pyi"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fr_columns",
                                    "A Flight Recorder pickle read into columns (compiled; optional).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_fr_columns(void) { return PyModule_Create(&module); }
