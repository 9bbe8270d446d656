/* Kineto trace events read straight into typed columns (optional; see kineto_columns.pyi).
 *
 * Why compiled: the typed path (kineto_typed: msgspec Structs, then kineto_extract's staging of each field into
 * arrays, one Python list per column) costs ~6 ms of CPU per trace of a simulated 1,024-rank job and ~250 ms on a
 * 54 MB trace, more than the gunzip (docs/performance.md, "Ninth pass"). This reader parses the text of the event
 * array once, skips the keys no frame reads while it parses, and writes each tabulated event's fields into plain
 * C buffers; the only Python objects it makes are one str per distinct name (a cache maps repeated names to their
 * code) and the collective args of the few events that carry them.
 *
 * Strictness: it accepts only what msgspec's typed decoder accepts and reads the same way (kineto_typed.Event,
 * Args). Anything else (NaN, Infinity, an id that is a float or too big for int64, a null where the typed decoder
 * wants a value, a duplicate or escaped key, an escaped category or phase, a surrogate escape, invalid UTF-8, a
 * control character in a string, nesting past MAX_DEPTH, stray bytes) is a refusal: it returns a short reason
 * (str) and the caller reads the file with the typed path, which stays the reference. Every read is
 * bounds-checked; running out of text in the middle of an event is not an error unless the text is final. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define NULLV INT64_MIN
#define NCOMM 12 /* COMM_ARG_KEYS; the GPU rows carry the first 9 */
#define NGPU_ARGS 9
#define NG 17
#define NC 8
#define CACHE 4096

enum { V_ABSENT = 0, V_NULL, V_INT, V_FLOAT, V_STR, V_TRUE, V_FALSE, V_NESTED };

typedef struct {
    uint8_t t;
    uint8_t esc;  /* V_STR: holds escapes */
    uint8_t neg;  /* V_INT: negative */
    uint8_t over; /* V_INT: magnitude past uint64 */
    uint64_t mag; /* V_INT: magnitude */
    const unsigned char *a; /* the value's text (V_STR: between the quotes) */
    Py_ssize_t n;
} Val;

typedef struct {
    const unsigned char *start, *p, *end;
    int eof; /* the text ran out (not an error unless final) */
    char why[160];
} R;

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

typedef struct {
    Val ph, cat, name, pid, tid, ts, dur;
    Val device, stream, corr, ext, ext_legacy, bps, gid, gnid;
    Val comm[NCOMM];
    Val dims, types;
    int64_t grid[3], block[3];
    int grid_n, block_n;
    uint32_t seen;
} Ev;

typedef struct {
    const unsigned char *key;
    Py_ssize_t n;
    int64_t code;
    int flags; /* 1: a collective op's name, 2: a shaped op's */
} Slot;

typedef struct {
    PyObject *names, *intern, *comm_ids, *shape_ids;
    Slot *slots;
    int used;
} Names;

static int fail(R *r, const char *fmt, Py_ssize_t at) {
    if (!r->why[0]) PyOS_snprintf(r->why, sizeof r->why, fmt, (long long)at);
    return -1;
}

static int eof(R *r) {
    r->eof = 1;
    return fail(r, "the text ends inside an event (byte %lld)", r->p - r->start);
}

static int bad(R *r, const char *what) {
    if (!r->why[0]) PyOS_snprintf(r->why, sizeof r->why, "%s at byte %lld", what, (long long)(r->p - r->start));
    return -1;
}

static void ws(R *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t')) r->p++;
}

static int buf_put(Buf *b, const void *v, Py_ssize_t sz) {
    if (b->n + sz > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + sz) cap *= 2;
        char *q = PyMem_Realloc(b->p, cap);
        if (!q) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, v, sz);
    b->n += sz;
    return 0;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Bytes a string holds as they are: printable ASCII but the quote and the backslash. */
static unsigned char PLAIN[256];

static void init_plain(void) {
    for (int c = 0x20; c < 0x80; c++) PLAIN[c] = c != '"' && c != '\\';
}

/* After the opening quote: the string's extent, escapes and UTF-8 checked. */
static int scan_string(R *r, Val *v) {
    const unsigned char *p = r->p, *end = r->end;
    v->t = V_STR;
    v->esc = 0;
    v->a = p;
    for (;;) {
        /* 8 bytes at a time while none is a quote, a backslash, a control character or non-ASCII */
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
            uint64_t special = ((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x;
            if (special & highs) break;
            p += 8;
        }
        while (p < end && PLAIN[*p]) p++;
        if (p >= end) {
            r->p = p;
            return eof(r);
        }
        unsigned char c = *p;
        if (c == '"') break;
        if (c == '\\') {
            if (p + 1 >= end) {
                r->p = p;
                return eof(r);
            }
            unsigned char e = p[1];
            v->esc = 1;
            if (e == 'u') {
                if (p + 6 > end) {
                    r->p = p;
                    return eof(r);
                }
                int h0 = hexval(p[2]), h1 = hexval(p[3]), h2 = hexval(p[4]), h3 = hexval(p[5]);
                if (h0 < 0 || h1 < 0 || h2 < 0 || h3 < 0) {
                    r->p = p;
                    return bad(r, "a bad \\u escape");
                }
                int cp = (h0 << 12) | (h1 << 8) | (h2 << 4) | h3;
                if (cp >= 0xD800 && cp <= 0xDFFF) {
                    r->p = p;
                    return bad(r, "a surrogate escape");
                }
                p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || !e) {
                r->p = p;
                return bad(r, "a bad escape");
            }
            p += 2;
            continue;
        }
        if (c < 0x20) {
            r->p = p;
            return bad(r, "a control character in a string");
        }
        if (c < 0x80) {
            p++;
            continue;
        }
        /* UTF-8: as Python's strict decoder (no overlong forms, no surrogates, nothing past U+10FFFF) */
        int need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else {
            r->p = p;
            return bad(r, "invalid UTF-8");
        }
        if (p + need >= end) {
            r->p = p;
            return eof(r);
        }
        if (p[1] < lo || p[1] > hi) {
            r->p = p;
            return bad(r, "invalid UTF-8");
        }
        for (int k = 2; k <= need; k++)
            if (p[k] < 0x80 || p[k] > 0xBF) {
                r->p = p;
                return bad(r, "invalid UTF-8");
            }
        p += need + 1;
    }
    v->n = p - v->a;
    r->p = p + 1;
    return 0;
}

/* The digits a fraction or an exponent needs (one at least) from *pp: 0 read, text follows; 1 the text ran out
   (the number may go on); -1 damaged. */
static inline int digit_run(R *r, const unsigned char **pp, const unsigned char *end) {
    const unsigned char *p = *pp;
    if (p < end && !(*p >= '0' && *p <= '9')) {
        r->p = p;
        return bad(r, "a bad number");
    }
    while (p < end && *p >= '0' && *p <= '9') p++;
    *pp = p;
    return p >= end;
}

static int scan_number(R *r, Val *v) {
    const unsigned char *p = r->p, *end = r->end;
    v->a = p;
    v->neg = 0;
    v->over = 0;
    v->mag = 0;
    int isfloat = 0;
    if (*p == '-') {
        v->neg = 1;
        p++;
    }
    if (p >= end) goto out;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            unsigned d = *p - '0';
            if (v->mag > (UINT64_MAX - d) / 10) v->over = 1;
            else v->mag = v->mag * 10 + d;
            p++;
        }
    } else {
        r->p = p;
        return bad(r, "not a JSON value");
    }
    if (p >= end) goto out;
    int got;
    if (*p == '.') {
        isfloat = 1;
        p++;
        if ((got = digit_run(r, &p, end)) != 0) goto ended;
    }
    if (*p == 'e' || *p == 'E') {
        isfloat = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if ((got = digit_run(r, &p, end)) != 0) goto ended;
    }
    v->t = isfloat ? V_FLOAT : V_INT;
    v->n = p - v->a;
    r->p = p;
    return 0;
ended:
    if (got < 0) return -1;
out:
    r->p = p;
    return eof(r); /* a number at the end of the text may go on */
}

static int literal(R *r, const char *word, int t, Val *v) {
    size_t n = strlen(word);
    v->a = r->p;
    for (size_t i = 0; i < n; i++) {
        if (r->p + i >= r->end) {
            r->p += i;
            return eof(r);
        }
        if (r->p[i] != (unsigned char)word[i]) return bad(r, "not a JSON value");
    }
    r->p += n;
    v->t = t;
    v->n = n;
    return 0;
}

static int value(R *r, Val *v, int depth);

static int container(R *r, Val *v, int depth) {
    unsigned char open = *r->p, close = open == '[' ? ']' : '}';
    Val tmp;
    v->a = r->p;
    if (depth >= MAX_DEPTH) return bad(r, "nesting too deep");
    r->p++;
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p == close) {
        r->p++;
        goto done;
    }
    for (;;) {
        if (open == '{') {
            if (r->p >= r->end) return eof(r);
            if (*r->p != '"') return bad(r, "an object key that is not a string");
            r->p++;
            if (scan_string(r, &tmp)) return -1;
            ws(r);
            if (r->p >= r->end) return eof(r);
            if (*r->p != ':') return bad(r, "no colon after a key");
            r->p++;
        }
        if (value(r, &tmp, depth + 1)) return -1;
        ws(r);
        if (r->p >= r->end) return eof(r);
        if (*r->p == close) {
            r->p++;
            break;
        }
        if (*r->p != ',') return bad(r, "a stray byte in a container");
        r->p++;
        ws(r);
    }
done:
    v->t = V_NESTED;
    v->n = r->p - v->a;
    return 0;
}

/* Any JSON value (after whitespace): its type and extent. */
static int value(R *r, Val *v, int depth) {
    ws(r);
    if (r->p >= r->end) return eof(r);
    unsigned char c = *r->p;
    if (c == '"') {
        r->p++;
        return scan_string(r, v);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return scan_number(r, v);
    if (c == '{' || c == '[') return container(r, v, depth);
    if (c == 't') return literal(r, "true", V_TRUE, v);
    if (c == 'f') return literal(r, "false", V_FALSE, v);
    if (c == 'n') return literal(r, "null", V_NULL, v);
    return bad(r, "not a JSON value (NaN, Infinity or damage)");
}

/* ---- typed views of a value, as msgspec's typed decoder takes them ---- */

static int int64_of(const Val *v, int64_t *out) {
    if (v->t != V_INT || v->over) return -1;
    if (v->neg) {
        if (v->mag > (uint64_t)1 << 63) return -1;
        *out = v->mag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)v->mag;
    } else {
        if (v->mag > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v->mag;
    }
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number as a correctly rounded double: exact fast paths, else Python's own dtoa. -1: not finite, too
 * long, or not a number. */
static int double_of(const Val *v, double *out) {
    if (v->t == V_INT) { /* as Python and msgspec convert an int: correctly rounded (the FPU's conversion) */
        if (v->over || (v->neg && v->mag > (uint64_t)1 << 63)) return -1;
        *out = v->neg ? (v->mag == (uint64_t)1 << 63 ? -9223372036854775808.0 : (double)-(int64_t)v->mag)
                      : (double)v->mag;
        return 0;
    }
    if (v->t != V_FLOAT) return -1;
    const unsigned char *p = v->a, *end = v->a + v->n;
    int neg = 0, digits = 0, frac = 0, exp = 0, eneg = 0, ebig = 0;
    uint64_t m = 0;
    if (*p == '-') neg = 1, p++;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (m || *p != '0') digits++;
        if (digits <= 19) m = m * 10 + (*p - '0');
    }
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            if (m || *p != '0') digits++;
            if (digits <= 19) m = m * 10 + (*p - '0');
            frac++;
        }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') eneg = *p++ == '-';
        for (; p < end; p++) {
            if (exp > 10000) ebig = 1;
            else exp = exp * 10 + (*p - '0');
        }
    }
    if (!ebig && digits <= 15 && m < ((uint64_t)1 << 53)) {
        int e10 = (eneg ? -exp : exp) - frac;
        double d = (double)m;
        if (e10 >= 0 && e10 <= 22) {
            *out = neg ? -(d * POW10[e10]) : d * POW10[e10];
            return 0;
        }
        if (e10 < 0 && e10 >= -22) {
            *out = neg ? -(d / POW10[-e10]) : d / POW10[-e10];
            return 0;
        }
    }
    char tmp[128];
    if (v->n >= (Py_ssize_t)sizeof tmp) return -1;
    memcpy(tmp, v->a, v->n);
    tmp[v->n] = 0;
    double d = PyOS_string_to_double(tmp, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (!isfinite(d)) return -1;
    *out = d;
    return 0;
}

/* A string value's text as UTF-8 (escapes decoded into tmp). */
static int utf8_of(const Val *v, Buf *tmp, const char **s, Py_ssize_t *n) {
    if (!v->esc) {
        *s = (const char *)v->a;
        *n = v->n;
        return 0;
    }
    tmp->n = 0;
    const unsigned char *p = v->a, *end = v->a + v->n;
    while (p < end) {
        char out[4];
        int k = 1;
        if (*p != '\\') {
            out[0] = *p++;
        } else {
            unsigned char e = p[1];
            if (e == 'u') {
                int cp = (hexval(p[2]) << 12) | (hexval(p[3]) << 8) | (hexval(p[4]) << 4) | hexval(p[5]);
                p += 6;
                if (cp < 0x80) out[0] = (char)cp;
                else if (cp < 0x800) out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
                else {
                    out[0] = (char)(0xE0 | (cp >> 12));
                    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    out[2] = (char)(0x80 | (cp & 0x3F));
                    k = 3;
                }
            } else {
                p += 2;
                out[0] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : (char)e;
            }
        }
        if (buf_put(tmp, out, k)) return -1;
    }
    *s = tmp->p ? tmp->p : "";
    *n = tmp->n;
    return 0;
}

static PyObject *str_of(const Val *v, Buf *tmp) {
    const char *s;
    Py_ssize_t n;
    if (utf8_of(v, tmp, &s, &n)) return NULL;
    return PyUnicode_DecodeUTF8(s, n, "strict");
}

/* ---- events ---- */

#define KEY(s) (klen == (Py_ssize_t)sizeof(s) - 1 && !memcmp(k, s, sizeof(s) - 1))

static const char *const COMM_KEYS[NCOMM] = {
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
    "Process Group Description", "Process Group Ranks", "Seq", "Src Rank", "Dst Rank", "Process Group ID"};

/* A key the reader keeps: where its value goes in Ev, and its bit in Ev.seen (a second one is damage). */
typedef struct {
    const char *name;
    Py_ssize_t len;
    size_t off; /* offsetof(Ev, ...): a Val */
    int bit;
} Field;

#define FIELD(s, member, b) {s, sizeof(s) - 1, offsetof(Ev, member), b}

/* In the order of the tests they replaced: the common keys first. "args" (bit 7), "grid" and "block" (20, 21)
   and the collective keys (COMM_KEYS) are read apart. */
static const Field EVENT_FIELDS[] = {FIELD("ph", ph, 0),   FIELD("cat", cat, 1), FIELD("name", name, 2),
                                     FIELD("pid", pid, 3), FIELD("tid", tid, 4), FIELD("ts", ts, 5),
                                     FIELD("dur", dur, 6)};
static const Field ARGS_FIELDS[] = {
    FIELD("device", device, 8),         FIELD("stream", stream, 9),      FIELD("correlation", corr, 10),
    FIELD("External id", ext, 11),      FIELD("external id", ext_legacy, 12), FIELD("blocks per SM", bps, 13),
    FIELD("graph id", gid, 14),         FIELD("graph node id", gnid, 15), FIELD("Input Dims", dims, 16),
    FIELD("Input type", types, 17)};
#define NFIELDS(t) ((int)(sizeof(t) / sizeof((t)[0])))

/* The field of ``table`` named by the key k (klen bytes), or NULL. */
static inline const Field *field(const Field *table, int n, const char *k, Py_ssize_t klen) {
    for (int i = 0; i < n; i++)
        if (klen == table[i].len && !memcmp(k, table[i].name, (size_t)klen)) return &table[i];
    return NULL;
}

static inline Val *field_val(Ev *ev, const Field *f) { return (Val *)((char *)ev + f->off); }

/* Marks the key of ``bit`` as read: -1 (damaged, ``why``) when it was read already in this object. */
static inline int seen_once(R *r, Ev *ev, int bit, const char *why) {
    if (ev->seen & (1u << bit)) return bad(r, why);
    ev->seen |= 1u << bit;
    return 0;
}

/* The slot of a collective key (COMM_KEYS), or NULL. */
static inline Val *comm_slot(Ev *ev, const char *k, Py_ssize_t klen) {
    for (int i = 0; i < NCOMM; i++)
        if (klen == (Py_ssize_t)strlen(COMM_KEYS[i]) && !memcmp(k, COMM_KEYS[i], (size_t)klen)) return &ev->comm[i];
    return NULL;
}

static int dims3(R *r, int64_t *dst, int *count, int depth) {
    /* a tuple[int, ...]: an array of int64 */
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p != '[') return bad(r, "grid or block that is not an array");
    r->p++;
    *count = 0;
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p == ']') {
        r->p++;
        return 0;
    }
    for (;;) {
        Val x;
        int64_t i;
        if (value(r, &x, depth + 1)) return -1;
        if (int64_of(&x, &i)) return bad(r, "a grid or block value that is not an int64");
        if (*count < 3) dst[*count] = i;
        (*count)++;
        ws(r);
        if (r->p >= r->end) return eof(r);
        if (*r->p == ']') {
            r->p++;
            return 0;
        }
        if (*r->p != ',') return bad(r, "a stray byte in grid or block");
        r->p++;
    }
}

/* The messages of one kind of object (an event or its args) when it is damaged. */
typedef struct {
    const char *not_object, *key_not_string, *escaped_key, *no_colon, *stray;
} ObjWords;

static const ObjWords EVENT_WORDS = {"an event that is not an object", "an event key that is not a string",
                                     "an escaped event key", "no colon after an event key",
                                     "a stray byte in an event"};
static const ObjWords ARGS_WORDS = {"args that are not an object", "an args key that is not a string",
                                    "an escaped args key", "no colon after an args key", "a stray byte in args"};

/* The key loops of events and args. Inline: gcc then compiles the loops as it did when they were written out
   twice (as calls they cost ~8% more instructions on a real trace). */

/* An object's '{' (the reader at it) and what follows: 1 when a key follows, 0 when it is empty, -1 when damaged. */
static inline int open_object(R *r, const ObjWords *what) {
    if (*r->p != '{') return bad(r, what->not_object);
    r->p++;
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p == '}') {
        r->p++;
        return 0;
    }
    return 1;
}

/* An object's key and its colon, the reader left at the value: 0, or -1 when damaged. */
static inline int next_key(R *r, Val *key, const ObjWords *what) {
    if (r->p >= r->end) return eof(r);
    if (*r->p != '"') return bad(r, what->key_not_string);
    r->p++;
    if (scan_string(r, key)) return -1;
    if (key->esc) return bad(r, what->escaped_key);
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p != ':') return bad(r, what->no_colon);
    r->p++;
    return 0;
}

/* After a value: 1 when a key follows (the reader at it), 0 at the object's end, -1 when damaged. */
static inline int after_value(R *r, const ObjWords *what) {
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p == '}') {
        r->p++;
        return 0;
    }
    if (*r->p != ',') return bad(r, what->stray);
    r->p++;
    ws(r);
    return 1;
}

static int args_object(R *r, Ev *ev) {
    ws(r);
    if (r->p >= r->end) return eof(r);
    if (*r->p == 'n') {
        Val x;
        return literal(r, "null", V_NULL, &x);
    }
    int more;
    for (more = open_object(r, &ARGS_WORDS); more > 0; more = after_value(r, &ARGS_WORDS)) {
        Val key, x;
        if (next_key(r, &key, &ARGS_WORDS)) return -1;
        const char *k = (const char *)key.a;
        Py_ssize_t klen = key.n;
        if (KEY("grid") || KEY("block")) {
            int is_grid = KEY("grid");
            if (seen_once(r, ev, is_grid ? 20 : 21, "a duplicate args key")) return -1;
            if (dims3(r, is_grid ? ev->grid : ev->block, is_grid ? &ev->grid_n : &ev->block_n, 2)) return -1;
            continue;
        }
        const Field *f = field(ARGS_FIELDS, NFIELDS(ARGS_FIELDS), k, klen);
        Val *dst = f ? field_val(ev, f) : comm_slot(ev, k, klen);
        if (f) {
            if (seen_once(r, ev, f->bit, "a duplicate args key")) return -1;
        } else if (dst && dst->t != V_ABSENT) /* a collective key read already */
            return bad(r, "a duplicate args key");
        if (value(r, dst ? dst : &x, 2)) return -1;
    }
    return more;
}

static int event(R *r, Ev *ev) {
    /* only what is read before it is set: the types (clearing the whole struct cost a tenth of the time) */
    ev->ph.t = ev->cat.t = ev->name.t = ev->pid.t = ev->tid.t = ev->ts.t = ev->dur.t = V_ABSENT;
    ev->device.t = ev->stream.t = ev->corr.t = ev->ext.t = ev->ext_legacy.t = ev->bps.t = V_ABSENT;
    ev->gid.t = ev->gnid.t = ev->dims.t = ev->types.t = V_ABSENT;
    for (int k = 0; k < NCOMM; k++) ev->comm[k].t = V_ABSENT;
    ev->grid_n = ev->block_n = 0;
    ev->seen = 0;
    int more;
    for (more = open_object(r, &EVENT_WORDS); more > 0; more = after_value(r, &EVENT_WORDS)) {
        Val key, x;
        if (next_key(r, &key, &EVENT_WORDS)) return -1;
        const char *k = (const char *)key.a;
        Py_ssize_t klen = key.n;
        const Field *f = field(EVENT_FIELDS, NFIELDS(EVENT_FIELDS), k, klen);
        int is_args = !f && KEY("args");
        if ((f || is_args) && seen_once(r, ev, f ? f->bit : 7, "a duplicate event key")) return -1;
        if (is_args) {
            if (args_object(r, ev)) return -1;
        } else if (value(r, f ? field_val(ev, f) : &x, 1))
            return -1;
    }
    return more;
}

/* ---- names ---- */

static uint64_t hash_bytes(const unsigned char *s, Py_ssize_t n) {
    /* the length and up to 24 bytes (head, middle, tail): names differ there; a collision only costs a probe */
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n, w;
    if (n < 8) {
        for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
        return h ^ (h >> 29);
    }
    memcpy(&w, s, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    memcpy(&w, s + n / 2 - 4, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    memcpy(&w, s + n - 8, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

/* The name's code in the extractor's table (interned by the extractor when new) and its flags. */
static int name_code(Names *nm, const Val *v, Buf *tmp, int64_t *code, int *flags) {
    uint64_t h = hash_bytes(v->a, v->n);
    size_t i = h & (CACHE - 1);
    for (;;) {
        Slot *s = &nm->slots[i];
        if (!s->key) break;
        if (s->n == v->n && !memcmp(s->key, v->a, v->n)) {
            *code = s->code;
            *flags = s->flags;
            return 0;
        }
        i = (i + 1) & (CACHE - 1);
    }
    PyObject *name = str_of(v, tmp);
    if (!name) return -1;
    PyObject *got = PyDict_GetItemWithError(nm->names, name);
    if (got) Py_INCREF(got);
    else if (!PyErr_Occurred()) got = PyObject_CallOneArg(nm->intern, name);
    Py_DECREF(name);
    if (!got) return -1;
    *code = PyLong_AsLongLong(got);
    int comm = *code == -1 && PyErr_Occurred() ? -1 : PySet_Contains(nm->comm_ids, got);
    int shape = comm < 0 ? -1 : PySet_Contains(nm->shape_ids, got);
    Py_DECREF(got);
    if (comm < 0 || shape < 0) return -1;
    *flags = comm | (shape << 1);
    if (nm->used < CACHE / 2) {
        Slot *s = &nm->slots[i];
        s->key = v->a;
        s->n = v->n;
        s->code = *code;
        s->flags = *flags;
        nm->used++;
    }
    return 0;
}

/* ---- rows ---- */

static const struct {
    const char *cat;
    int gpu, code;
} CATS[] = {{"kernel", 1, 0},  {"Kernel", 1, 0},   {"gpu_memcpy", 1, 1},      {"Memcpy", 1, 1},
            {"gpu_memset", 1, 2}, {"Memset", 1, 2}, {"cuda_sync", 1, 3},      {"cpu_op", 0, 0},
            {"Operator", 0, 0}, {"user_annotation", 0, 1}, {"gpu_user_annotation", 0, 2}, {"cuda_runtime", 0, 3},
            {"Runtime", 0, 3},  {"cuda_driver", 0, 4}, {"python_function", 0, 5}, {"Python", 0, 5}};

/* An id as kineto_extract._ids takes it: an int as it is, a legacy "stream 7" by its last word, else NULL.
 * -1: a value the typed path reads another way (refused). */
static int id_of(const Val *v, int64_t *out) {
    if (v->t == V_ABSENT || v->t == V_NULL) {
        *out = NULLV;
        return 0;
    }
    if (v->t == V_INT) return int64_of(v, out);
    if (v->t != V_STR || v->esc) return -1;
    const unsigned char *s = v->a, *end = v->a + v->n, *w = s;
    for (const unsigned char *q = s; q < end; q++) {
        if (*q >= 0x80) return -1;
        if (*q == ' ') w = q + 1;
    }
    const unsigned char *d = w;
    int neg = 0;
    while (d < end && *d == '-') neg++, d++; /* str.lstrip("-") */
    if (d == end) {
        *out = NULLV;
        return 0;
    }
    for (const unsigned char *q = d; q < end; q++)
        if (*q < '0' || *q > '9') {
            *out = NULLV;
            return 0;
        }
    if (neg > 1) return -1; /* int("--5") raises */
    uint64_t m = 0;
    for (; d < end; d++) {
        if (m > (UINT64_MAX - 9) / 10) {
            *out = NULLV;
            return 0;
        }
        m = m * 10 + (*d - '0');
    }
    if (m > (uint64_t)INT64_MAX) { /* _to_int: NULL outside (-2**63, 2**63) */
        *out = NULLV;
        return 0;
    }
    *out = neg ? -(int64_t)m : (int64_t)m;
    return 0;
}

static int check_int(const Val *v, int nullable, int64_t dflt, int64_t *out) {
    if (v->t == V_ABSENT || (nullable && v->t == V_NULL)) {
        *out = dflt;
        return 0;
    }
    return int64_of(v, out);
}

static int check_float(const Val *v, int nullable, double *out) {
    if (v->t == V_ABSENT || (nullable && v->t == V_NULL)) {
        *out = NAN;
        return 0;
    }
    return double_of(v, out);
}

typedef struct {
    Buf g[NG], c[NC];
    int64_t ng, nc, events, skipped, g0, c0; /* g0, c0: the extractor's rows before this call */
    PyObject *gargs, *cops, *sops;
    Buf tmp;
} Out;

/* A collective arg as kineto_extract._typed_arg converts it: None when absent or null, the int columns'
 * values through _to_int (None for NULL), the text columns' as str(). NULL with why set: refused (nested, an
 * integer past 64 bits, a text id it does not read the way Python does). */
static PyObject *arg_of(R *r, const Val *v, int intcol, Out *o) {
    double d;
    int64_t i;
    switch (v->t) {
    case V_ABSENT:
    case V_NULL: Py_RETURN_NONE;
    case V_TRUE:
    case V_FALSE:
        if (intcol) Py_RETURN_NONE;
        return PyUnicode_FromString(v->t == V_TRUE ? "True" : "False");
    case V_STR:
        if (!intcol) return str_of(v, &o->tmp);
        if (id_of(v, &i)) break;
        if (i == NULLV) Py_RETURN_NONE;
        return PyLong_FromLongLong(i);
    case V_INT:
        if (v->over || (v->neg && v->mag > (uint64_t)1 << 63)) break;
        if (intcol) {
            if (v->neg ? v->mag >= (uint64_t)1 << 63 : v->mag > (uint64_t)INT64_MAX) Py_RETURN_NONE;
            return PyLong_FromLongLong(v->neg ? -(int64_t)v->mag : (int64_t)v->mag);
        } else {
            PyObject *n = v->neg ? PyLong_FromLongLong(v->mag == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)v->mag)
                                 : PyLong_FromUnsignedLongLong(v->mag);
            if (!n) return NULL;
            PyObject *t = PyObject_Str(n);
            Py_DECREF(n);
            return t;
        }
    case V_FLOAT:
        if (double_of(v, &d)) break;
        if (!intcol) {
            PyObject *f = PyFloat_FromDouble(d), *t;
            if (!f) return NULL;
            t = PyObject_Str(f);
            Py_DECREF(f);
            return t;
        }
        /* _to_int of a float: an integral value within (-2**63, 2**63), else NULL */
        if (d != floor(d) || !(d > -9223372036854775808.0 && d < 9223372036854775808.0)) Py_RETURN_NONE;
        return PyLong_FromLongLong((long long)d);
    }
    fail(r, "a collective arg it does not take (nested, or a number out of range) near byte %lld", v->a - r->start);
    return NULL;
}

/* The int columns of COMM_ARG_KEYS (kineto_extract._INT_ARGS). */
static const int INTCOL[NCOMM] = {0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 0};

static int put_row(R *r, Out *o, PyObject *list, int64_t row, const Val *vals, int n) {
    PyObject *t = PyTuple_New(n + 1);
    if (!t) return -1;
    PyObject *i = PyLong_FromLongLong(row);
    if (!i) goto err;
    PyTuple_SET_ITEM(t, 0, i);
    for (int k = 0; k < n; k++) {
        PyObject *x = arg_of(r, &vals[k], INTCOL[k], o);
        if (!x) goto err;
        PyTuple_SET_ITEM(t, k + 1, x);
    }
    int rc = PyList_Append(list, t);
    Py_DECREF(t);
    return rc;
err:
    Py_DECREF(t);
    return -1;
}

/* Raw text of a value (msgspec's Raw): a string with its quotes. */
static PyObject *raw_of(const Val *v) {
    if (v->t == V_ABSENT) Py_RETURN_NONE;
    if (v->t == V_STR) return PyBytes_FromStringAndSize((const char *)v->a - 1, v->n + 2);
    return PyBytes_FromStringAndSize((const char *)v->a, v->n);
}

static int put_shape(Out *o, int64_t row, const Ev *ev) {
    PyObject *t = Py_BuildValue("(LNN)", (long long)row, raw_of(&ev->dims), raw_of(&ev->types));
    if (!t) return -1;
    int rc = PyList_Append(o->sops, t);
    Py_DECREF(t);
    return rc;
}

#define PUT(b, x)                                                                                                  \
    do {                                                                                                           \
        if (buf_put(&(b), &(x), sizeof(x))) return -1;                                                             \
    } while (0)

/* Check one event's fields as the typed decoder types them, and write its row if tabulated. -1 with why set:
 * refused; -1 with an exception: an error. */
static int take(R *r, Ev *ev, Names *nm, Out *o) {
    int64_t i64, device, stream, corr, ext, extl, gid, gnid, pid, tid;
    double ts = NAN, dur, bps;
    const unsigned char *at = r->p;
#define NO(msg) (r->p = at, bad(r, msg))
    if (ev->ph.t != V_ABSENT && ev->ph.t != V_NULL && (ev->ph.t != V_STR || ev->ph.esc)) return NO("an odd ph");
    if (ev->cat.t != V_ABSENT && ev->cat.t != V_NULL && (ev->cat.t != V_STR || ev->cat.esc)) return NO("an odd cat");
    if (ev->name.t != V_ABSENT && ev->name.t != V_NULL && ev->name.t != V_STR) return NO("a name that is not a string");
    if (ev->pid.t == V_INT ? int64_of(&ev->pid, &i64) : ev->pid.t > V_NULL && ev->pid.t != V_STR) return NO("an odd pid");
    if (ev->tid.t == V_INT ? int64_of(&ev->tid, &i64) : ev->tid.t > V_NULL && ev->tid.t != V_STR) return NO("an odd tid");
    if (ev->ts.t > V_NULL && double_of(&ev->ts, &ts)) return NO("a ts that is not a finite number");
    if (check_float(&ev->dur, 0, &dur)) return NO("a dur that is not a finite number");
    if (check_int(&ev->device, 1, NULLV, &device) || check_int(&ev->stream, 1, NULLV, &stream) ||
        check_int(&ev->corr, 0, NULLV, &corr) || check_int(&ev->ext, 1, NULLV, &ext) ||
        check_int(&ev->ext_legacy, 0, NULLV, &extl) || check_int(&ev->gid, 0, NULLV, &gid) ||
        check_int(&ev->gnid, 0, NULLV, &gnid))
        return NO("an args id that is not an int64");
    if (check_float(&ev->bps, 0, &bps)) return NO("blocks per SM that is not a finite number");
    for (int k = 0; k < NCOMM; k++)
        if (ev->comm[k].t == V_INT && ev->comm[k].over) return NO("a collective arg past 64 bits");
    o->events++;
    int gpu = -1, code = 0;
    if (ev->cat.t == V_STR)
        for (size_t k = 0; k < sizeof CATS / sizeof CATS[0]; k++)
            if ((Py_ssize_t)strlen(CATS[k].cat) == ev->cat.n && !memcmp(CATS[k].cat, ev->cat.a, ev->cat.n)) {
                gpu = CATS[k].gpu;
                code = CATS[k].code;
                break;
            }
    if (gpu < 0) {
        o->skipped++;
        return 0;
    }
    if (ev->name.t != V_STR) return NO("a tabulated event without a name");
    if (ev->ph.t == V_STR && ev->ph.n == 1 && strchr("sfti", ev->ph.a[0]))
        return NO("a flow or instant event of a tabulated category");
    if (ev->ts.t <= V_NULL) return NO("a tabulated event without a ts");
    int64_t nid;
    int flags;
    if (name_code(nm, &ev->name, &o->tmp, &nid, &flags)) return -1;
    if (ext == NULLV && (ev->ext.t == V_ABSENT || ev->ext.t == V_NULL)) ext = extl;
    if (id_of(&ev->pid, &pid) || id_of(&ev->tid, &tid)) return NO("a pid or tid it does not take");
    if (gpu) {
        int8_t kind = (int8_t)code;
        int64_t grid[3] = {NULLV, NULLV, NULLV}, block[3] = {NULLV, NULLV, NULLV};
        for (int k = 0; k < 3 && k < ev->grid_n; k++) grid[k] = ev->grid[k];
        for (int k = 0; k < 3 && k < ev->block_n; k++) block[k] = ev->block[k];
        if (ev->device.t == V_ABSENT || ev->device.t == V_NULL) device = pid;
        if (ev->stream.t == V_ABSENT || ev->stream.t == V_NULL) stream = tid;
        /* _GROW order */
        PUT(o->g[0], kind); PUT(o->g[1], nid); PUT(o->g[2], ts); PUT(o->g[3], dur); PUT(o->g[4], device);
        PUT(o->g[5], stream); PUT(o->g[6], corr); PUT(o->g[7], ext); PUT(o->g[8], grid[0]); PUT(o->g[9], grid[1]);
        PUT(o->g[10], grid[2]); PUT(o->g[11], block[0]); PUT(o->g[12], block[1]); PUT(o->g[13], block[2]);
        PUT(o->g[14], bps); PUT(o->g[15], gid); PUT(o->g[16], gnid);
        if ((ev->comm[0].t != V_ABSENT || ev->comm[1].t != V_ABSENT) &&
            put_row(r, o, o->gargs, o->g0 + o->ng, ev->comm, NGPU_ARGS))
            return -1;
        o->ng++;
        return 0;
    }
    int8_t cat = (int8_t)code;
    /* _CROW order */
    PUT(o->c[0], cat); PUT(o->c[1], nid); PUT(o->c[2], ts); PUT(o->c[3], dur); PUT(o->c[4], pid);
    PUT(o->c[5], tid); PUT(o->c[6], corr); PUT(o->c[7], ext);
    if ((flags & 1) && code <= 1) {
        if (put_row(r, o, o->cops, o->c0 + o->nc, ev->comm, NCOMM)) return -1;
    } else if ((flags & 2) && ev->dims.t != V_ABSENT) {
        if (put_shape(o, o->c0 + o->nc, ev)) return -1;
    }
    o->nc++;
    return 0;
#undef NO
}

/* The events of text[pos:] up to the array's end or the last whole event. */
static int run(R *r, int first, Names *nm, Out *o, Py_ssize_t *used, int *done, int final) {
    *used = r->p - r->start;
    *done = 0;
    Ev ev;
    for (;;) {
        ws(r);
        if (r->p >= r->end) break;
        if (*r->p == ']') {
            r->p++;
            *used = r->p - r->start;
            *done = 1;
            return 0;
        }
        if (!first) {
            if (*r->p != ',') return bad(r, "a stray byte between events");
            r->p++;
            ws(r);
            if (r->p >= r->end) break;
        }
        if (event(r, &ev)) {
            if (r->eof && !final && !PyErr_Occurred()) {
                r->why[0] = 0;
                return 0;
            }
            return -1;
        }
        if (take(r, &ev, nm, o)) return -1;
        first = 0;
        *used = r->p - r->start;
    }
    if (final) return fail(r, "the text ends inside the event array (byte %lld)", r->p - r->start);
    return 0;
}

static PyObject *columns(Buf *bufs, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *b = PyBytes_FromStringAndSize(bufs[k].p ? bufs[k].p : "", bufs[k].n);
        if (!b) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k, b);
    }
    return t;
}

static PyObject *kc_read(PyObject *Py_UNUSED(self), PyObject *a) {
    Py_buffer text;
    Py_ssize_t pos;
    int first, final;
    Names nm = {0};
    Out o;
    PyObject *out = NULL;
    memset(&o, 0, sizeof o);
    if (!PyArg_ParseTuple(a, "y*nppO!OO!O!LL", &text, &pos, &first, &final, &PyDict_Type, &nm.names, &nm.intern,
                          &PySet_Type, &nm.comm_ids, &PySet_Type, &nm.shape_ids, &o.g0, &o.c0))
        return NULL;
    R r = {0};
    r.start = text.buf;
    r.end = r.start + text.len;
    if (pos < 0 || pos > text.len) {
        PyErr_SetString(PyExc_ValueError, "pos out of range");
        goto done;
    }
    r.p = r.start + pos;
    nm.slots = PyMem_Calloc(CACHE, sizeof(Slot));
    o.gargs = PyList_New(0);
    o.cops = PyList_New(0);
    o.sops = PyList_New(0);
    if (!nm.slots || !o.gargs || !o.cops || !o.sops) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t used;
    int isdone;
    if (run(&r, first, &nm, &o, &used, &isdone, final)) {
        if (PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_MemoryError) || !r.why[0]) goto done; /* raised */
            PyErr_Clear(); /* e.g. a name Python will not decode: the typed path decides */
        }
        out = PyUnicode_FromString(r.why[0] ? r.why : "refused");
        goto done;
    }
    PyObject *g = columns(o.g, NG), *c = g ? columns(o.c, NC) : NULL;
    if (g && c)
        out = Py_BuildValue("(nNLLNNOOO)", used, PyBool_FromLong(isdone), (long long)o.events,
                            (long long)o.skipped, g, c, o.gargs, o.cops, o.sops);
    else {
        Py_XDECREF(g);
        Py_XDECREF(c);
    }
done:
    for (int k = 0; k < NG; k++) PyMem_Free(o.g[k].p);
    for (int k = 0; k < NC; k++) PyMem_Free(o.c[k].p);
    PyMem_Free(o.tmp.p);
    PyMem_Free(nm.slots);
    Py_XDECREF(o.gargs);
    Py_XDECREF(o.cops);
    Py_XDECREF(o.sops);
    PyBuffer_Release(&text);
    return out;
}

static PyMethodDef methods[] = {
    {"read", kc_read, METH_VARARGS,
     "read(text, pos, first, final, names, intern, comm_ids, shape_ids, g0, c0) -> tuple | str: see "
     "kineto_columns.pyi"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kineto_columns",
                                    "Kineto trace events read into columns (compiled; optional).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_kineto_columns(void) {
    init_plain();
    return PyModule_Create(&module);
}
