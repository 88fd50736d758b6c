/* Per-step records to schedspec.trace/1 text, one record after another: the
   CPython extension module schedspec.gpu.trace_render.

   The native twin of gpu/trace_text.py's numpy renderer (`_render`): the same
   inputs (the record columns of a chunk, (T, S, R) arrays as gpu/batch.py copies
   them from the device), the same text, byte for byte (tests/test_torch_trace_text.py
   compares the two on every flag combination, odd ids and large numbers).  The
   numpy renderer places some 250 pieces of text per step of 32 requests by index
   arithmetic, about 12 us of host time a step; a loop over the records writes the
   same 1.4 kB in well under one.

   Built when schedspec is installed (pyproject.toml [tool.setuptools] ext-modules,
   optional: an install without a C compiler goes on without it); gpu/trace_native.py
   imports it and, where it is missing, runs the numpy renderer with a warning.
   The module's functions (`render`, `record_bound`, at the end of this file) take
   Python objects and check each one against its buffer's own shape and item
   format, so no call from Python reaches the loop with arrays it would read or
   write past.

   A record is (step t, scenario row s).  Its text is `,\n{"step": ...}` with the
   keys of reference/engine.py in order (formats.md, Trace); a record with nothing
   to list (an idle step) is left out: its length is 0. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* An integer column (T, S, R) or (S, R) of any width numpy hands over. */
typedef struct {
    const void *data;
    int64_t itemsize; /* 1 (int8, bool), 2, 4 or 8; signed */
} column;

/* Slots [i, i + n) of a column as int64 (an absent column reads 0). */
static void load(const column *c, int64_t i, int64_t n, int64_t *to) {
    if (c->data == NULL) {
        memset(to, 0, sizeof(int64_t) * (size_t)n);
        return;
    }
    switch (c->itemsize) {
    case 1: for (int64_t r = 0; r < n; r++) to[r] = ((const int8_t *)c->data)[i + r]; break;
    case 2: for (int64_t r = 0; r < n; r++) to[r] = ((const int16_t *)c->data)[i + r]; break;
    case 4: for (int64_t r = 0; r < n; r++) to[r] = ((const int32_t *)c->data)[i + r]; break;
    default: memcpy(to, (const int64_t *)c->data + i, sizeof(int64_t) * (size_t)n); break;
    }
}

/* The record columns, in this order (gpu/trace_native.py FIELDS, the `columns` tuple). */
enum { GRANT, NCT, STATUS, RUN_POS, WAIT_KEY, ADMITTED, PREEMPT_ORDER, SAMPLED, ABORTED,
       HIT_TOKENS, APP_KEY, STOPPED, NUM_FIELDS };

/* RequestStatus codes (vLLM's, passed in so that nothing is restated here). */
typedef struct {
    int64_t waiting, running, preempted, stopped, length_capped;
} codes;

typedef struct {
    char *p;
} out_t;

static inline void put(out_t *o, const char *s, size_t n) {
    memcpy(o->p, s, n);
    o->p += n;
}

#define PUTS(o, lit) put((o), (lit), sizeof(lit) - 1)

/* A number as json.dumps writes an int, two digits at a time. */
static const char digit_pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static inline void num(out_t *o, int64_t v) {
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (v < 0)
        *o->p++ = '-';
    int n = 1; /* digits, counted first so that they go straight to their places */
    for (uint64_t x = u; x >= 10; x /= 10)
        n++;
    char *b = o->p + n;
    o->p = b;
    while (u >= 100) {
        const unsigned k = (unsigned)(u % 100) * 2;
        u /= 100;
        b -= 2;
        b[0] = digit_pairs[k];
        b[1] = digit_pairs[k + 1];
    }
    if (u >= 10) {
        b[-2] = digit_pairs[u * 2];
        b[-1] = digit_pairs[u * 2 + 1];
    } else {
        b[-1] = (char)('0' + u);
    }
}

/* A request's id as a list item (its JSON string; a padding slot, which only a
   broken implementation lists, reads null as json.dumps writes None) or as an
   object key (a padding slot: "null"). */
typedef struct {
    const char *pool;
    const int64_t *off, *len; /* per code s * R + r; len < 0: padding */
} ids_t;

/* An id's text: short ones (nearly all) as one fixed 16-byte copy, whose
   bytes past the id the next piece overwrites; the id pool ends in 16 spare
   bytes and every record's room (record_bound) has 16 more. */
static inline void id_text(out_t *o, const ids_t *ids, int64_t code) {
    const int64_t n = ids->len[code];
    const char *src = ids->pool + ids->off[code];
    if (n <= 16)
        memcpy(o->p, src, 16);
    else
        memcpy(o->p, src, (size_t)n);
    o->p += n;
}

static inline void item(out_t *o, const ids_t *ids, int64_t code) {
    if (ids->len[code] < 0)
        PUTS(o, "null");
    else
        id_text(o, ids, code);
}

static inline void key(out_t *o, const ids_t *ids, int64_t code) {
    if (ids->len[code] < 0)
        PUTS(o, "\"null\"");
    else
        id_text(o, ids, code);
}

/* A JSON list's items: the ids of slots list[0..n). */
static inline void items(out_t *o, const ids_t *ids, int64_t code0, const int64_t *slot, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (i)
            PUTS(o, ", ");
        item(o, ids, code0 + slot[i]);
    }
}

/* A JSON object's members: "id": value[slot] for slots slot[0..n). */
static inline void pairs(out_t *o, const ids_t *ids, int64_t code0, const int64_t *slot, int64_t n,
                         const int64_t *value) {
    for (int64_t i = 0; i < n; i++) {
        if (i)
            PUTS(o, ", ");
        key(o, ids, code0 + slot[i]);
        PUTS(o, ": ");
        num(o, value[slot[i]]);
    }
}

/* Slots sorted by (key, slot): numpy's stable argsort of the keys over the members. */
typedef struct {
    int64_t key, slot;
} keyed;

static int keyed_cmp(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->slot < y->slot ? -1 : (x->slot > y->slot);
}

static void sort_keyed(keyed *k, int64_t n) {
    if (n > 48) {
        qsort(k, (size_t)n, sizeof(keyed), keyed_cmp);
        return;
    }
    for (int64_t i = 1; i < n; i++) { /* mostly in order already: running order follows the slots */
        keyed v = k[i];
        int64_t j = i - 1;
        while (j >= 0 && keyed_cmp(&k[j], &v) > 0) {
            k[j + 1] = k[j];
            j--;
        }
        k[j + 1] = v;
    }
}

static inline void keyed_items(out_t *o, const ids_t *ids, int64_t code0, const keyed *k, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (i)
            PUTS(o, ", ");
        item(o, ids, code0 + k[i].slot);
    }
}

/* A record's lists: sorted by a key (K_), or slots in running or slot order (L_). */
enum { K_RUN, K_PREEMPTED, K_ABORTED, K_STOPPED, K_WAITING, K_SAMPLED, NUM_KEYED };
enum { L_SCHEDULED, L_NEW, L_RESUMED, L_ADMITTED, L_RUNNING, L_SAMPLED, L_LIVE, NUM_LISTS };

/* The most bytes one record can take: the keys and five scalars, and per slot
   every list it can be in (ten, with a comma; a number in three, a reason in
   two), and 16 bytes that a short id's copy may write past its end.  An id is
   at least as long as its padding form "null" in quotes. */
static int64_t record_bound(int64_t R, int64_t max_id_len) {
    const int64_t id_room = (max_id_len > 6 ? max_id_len : 6) + 2;
    return 768 + 16 + R * (10 * id_room + 128);
}

/* Renders records (tt[m], ss[m]), m < M, one after another into out (capacity
   cap bytes); rec_end[m] is where record m's text ends (equal to the previous
   end for a record left out).  Returns the bytes written, or -1 when a record
   could not fit (the caller sized out too small: a bug) or scratch memory
   could not be had.

   cols[f]: field f's column (T, S, R); a field absent from the batch has data
   NULL (HIT_TOKENS without prefix caching in the batch; APP_KEY and STOPPED
   without async scheduling: then the batch applied is the one scheduled).
   scal (T, S, ncols) int64: free blocks, slots held, active, and with async
   scheduling schedule_called and the step applied (-1: none).  abort_rank (S, R):
   each request's place in its scenario's abort list.  prefix_rows, async_rows (S,):
   the scenario rows with prefix caching, with async scheduling. */
static int64_t render(int64_t M, const int64_t *tt, const int64_t *ss, int64_t S, int64_t R,
                     int64_t first_step, const column *cols, const int64_t *scal, int64_t ncols,
                     const int64_t *abort_rank, const uint8_t *prefix_rows, const uint8_t *async_rows,
                     const char *id_pool, const int64_t *id_off, const int64_t *id_len,
                     int64_t max_id_len, codes c, char *out, int64_t cap, int64_t *rec_end) {
    const ids_t ids = {id_pool, id_off, id_len};
    const int applied = cols[APP_KEY].data != NULL;
    const int64_t bound = record_bound(R, max_id_len);
    const size_t slots = (size_t)(R > 0 ? R : 1);
    /* scratch: the record's columns as int64, and its lists (slots sorted by
       a key, or slots in running order) */
    int64_t *vals = malloc(sizeof(int64_t) * slots * NUM_FIELDS);
    keyed *order = malloc(sizeof(keyed) * slots * NUM_KEYED);
    int64_t *lists = malloc(sizeof(int64_t) * slots * NUM_LISTS);
    if (vals == NULL || order == NULL || lists == NULL) {
        free(vals);
        free(order);
        free(lists);
        return -1;
    }
#define V(field, slot) vals[(field) * R + (slot)]
    keyed *by[NUM_KEYED];
    int64_t *list[NUM_LISTS];
    for (int k = 0; k < NUM_KEYED; k++)
        by[k] = order + k * R;
    for (int k = 0; k < NUM_LISTS; k++)
        list[k] = lists + k * R;
    out_t o = {out};
    for (int64_t m = 0; m < M; m++) {
        if ((o.p - out) + bound > cap) {
            free(vals);
            free(order);
            free(lists);
            return -1;
        }
        const int64_t t = tt[m], s = ss[m];
        const int64_t base = (t * S + s) * R; /* the record's slots in a (T, S, R) column */
        const int64_t *sc = scal + (t * S + s) * ncols;
        const int64_t code0 = s * R;          /* the id code of slot 0 */
        for (int f = 0; f < NUM_FIELDS; f++)
            load(&cols[f], base, R, &V(f, 0));
        const int is_async = applied && async_rows[s];
        int64_t called = 0, app_step = -1;
        if (applied) {
            called = sc[3];
            app_step = sc[4];
        }
        /* One pass over the slots: the members of every list kept by a key. */
        int64_t nk[NUM_KEYED] = {0};
        int64_t n_live = 0;
        for (int64_t r = 0; r < R; r++) {
            const int64_t st = V(STATUS, r);
            const int running = st == c.running, sched = V(GRANT, r) > 0;
            const int live = st >= c.waiting && st <= c.preempted;
            int stopped;
            if (applied)
                stopped = V(STOPPED, r) != 0;
            else
                stopped = sched && (st == c.stopped || st == c.length_capped);
#define ADD(which, k)                            \
    do {                                         \
        by[which][nk[which]].key = (k);          \
        by[which][nk[which]].slot = r;           \
        nk[which]++;                             \
    } while (0)
            if (running || sched)
                ADD(K_RUN, V(RUN_POS, r)); /* running order: the running and granted slots by run_pos */
            if (V(PREEMPT_ORDER, r) >= 0)
                ADD(K_PREEMPTED, V(PREEMPT_ORDER, r));
            if (V(ABORTED, r) != 0)
                ADD(K_ABORTED, abort_rank[code0 + r]);
            if (stopped) /* in the order of the batch applied */
                ADD(K_STOPPED, V(applied ? APP_KEY : RUN_POS, r));
            if (live && !running)
                ADD(K_WAITING, V(WAIT_KEY, r));
            if (applied && V(SAMPLED, r) != 0)
                ADD(K_SAMPLED, V(APP_KEY, r));
#undef ADD
            if (live)
                list[L_LIVE][n_live++] = r; /* slot order */
        }
        const int busy = nk[K_RUN] || n_live || nk[K_ABORTED] || nk[K_STOPPED] ||
                         (is_async && (called != 0 || app_step >= 0));
        if (!busy) {
            rec_end[m] = o.p - out;
            continue;
        }
        for (int k = 0; k < NUM_KEYED; k++)
            sort_keyed(by[k], nk[k]);

        PUTS(&o, ",\n{\"step\": ");
        num(&o, t + first_step);

        /* One pass in running order: the grants written, the other running-order lists kept. */
        PUTS(&o, ", \"scheduled\": [");
        int64_t nl[NUM_LISTS] = {0};
        for (int64_t i = 0; i < nk[K_RUN]; i++) {
            const int64_t r = by[K_RUN][i].slot, g = V(GRANT, r), adm = V(ADMITTED, r);
            if (g > 0) {
                if (nl[L_SCHEDULED]++)
                    PUTS(&o, ", ");
                PUTS(&o, "[");
                item(&o, &ids, code0 + r);
                PUTS(&o, ", ");
                num(&o, g);
                PUTS(&o, "]");
                if (adm == 1)
                    list[L_NEW][nl[L_NEW]++] = r;
                else if (adm == 2)
                    list[L_RESUMED][nl[L_RESUMED]++] = r;
                if (adm > 0)
                    list[L_ADMITTED][nl[L_ADMITTED]++] = r;
                if (!applied && V(SAMPLED, r) != 0)
                    list[L_SAMPLED][nl[L_SAMPLED]++] = r;
            }
            if (V(STATUS, r) == c.running)
                list[L_RUNNING][nl[L_RUNNING]++] = r;
        }
        PUTS(&o, "], \"new\": [");
        items(&o, &ids, code0, list[L_NEW], nl[L_NEW]);
        PUTS(&o, "], \"resumed\": [");
        items(&o, &ids, code0, list[L_RESUMED], nl[L_RESUMED]);
        PUTS(&o, "], \"preempted\": [");
        keyed_items(&o, &ids, code0, by[K_PREEMPTED], nk[K_PREEMPTED]);

        /* finished: this step's aborts in the scenario's abort order, then the
           requests the update stopped, in the order of the batch applied */
        PUTS(&o, "], \"finished\": [");
        for (int64_t i = 0; i < nk[K_ABORTED]; i++) {
            if (i)
                PUTS(&o, ", ");
            PUTS(&o, "[");
            item(&o, &ids, code0 + by[K_ABORTED][i].slot);
            PUTS(&o, ", \"aborted\"]");
        }
        for (int64_t i = 0; i < nk[K_STOPPED]; i++) {
            const int64_t r = by[K_STOPPED][i].slot, st = V(STATUS, r);
            if (i || nk[K_ABORTED])
                PUTS(&o, ", ");
            PUTS(&o, "[");
            item(&o, &ids, code0 + r);
            PUTS(&o, ", ");
            /* a stop with another status has no reason: only a broken
               implementation writes one (the numpy renderer writes nothing too) */
            if (st == c.stopped)
                PUTS(&o, "\"stopped\"]");
            else if (st == c.length_capped)
                PUTS(&o, "\"length\"]");
        }
        PUTS(&o, "], \"running\": [");
        items(&o, &ids, code0, list[L_RUNNING], nl[L_RUNNING]);
        PUTS(&o, "], \"waiting\": [");
        keyed_items(&o, &ids, code0, by[K_WAITING], nk[K_WAITING]);

        PUTS(&o, "], \"num_computed_tokens\": {");
        pairs(&o, &ids, code0, list[L_LIVE], n_live, &V(NCT, 0));
        PUTS(&o, "}, \"num_free_blocks\": ");
        num(&o, sc[0]);

        /* sampled: in the order of the batch applied */
        PUTS(&o, ", \"sampled\": [");
        if (applied)
            keyed_items(&o, &ids, code0, by[K_SAMPLED], nk[K_SAMPLED]);
        else
            items(&o, &ids, code0, list[L_SAMPLED], nl[L_SAMPLED]);
        PUTS(&o, "], \"slots_held\": ");
        num(&o, sc[1]);

        if (prefix_rows[s]) {
            /* each admission's hit, in admission (running) order */
            PUTS(&o, ", \"prefix_hits\": {");
            pairs(&o, &ids, code0, list[L_ADMITTED], nl[L_ADMITTED], &V(HIT_TOKENS, 0));
            PUTS(&o, "}");
        }
        if (is_async) {
            if (called)
                PUTS(&o, ", \"schedule_called\": true, \"applied_step\": ");
            else
                PUTS(&o, ", \"schedule_called\": false, \"applied_step\": ");
            if (app_step < 0)
                PUTS(&o, "null");
            else
                num(&o, app_step);
        }
        PUTS(&o, "}");
        rec_end[m] = o.p - out;
    }
#undef V
    free(vals);
    free(order);
    free(lists);
    return o.p - out;
}

/* ---- The module's functions: every argument checked before the loop runs ---- */

/* render's buffers: the record columns (GRANT ... STOPPED), then these. */
enum { SCAL = NUM_FIELDS, TT, SS, ABORT, PREFIX, ASYNC, POOL, OFF, LEN, OUT, ENDS, NUM_BUFS };

/* What a buffer must hold: integers of any width the loop reads (signed, or
   bool), int64 only, or bytes (uint8 or bool). */
enum { ANY_INT, INT64, BYTES };

/* The item format of a buffer, without a native byte-order prefix. */
static char item_kind(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=')
        f++;
    return f[0] != '\0' && f[1] == '\0' ? f[0] : '\0';
}

/* obj as a C-contiguous buffer of `ndim` dimensions holding `want`; a
   TypeError or ValueError naming the argument otherwise. */
static int get_buffer(PyObject *obj, const char *name, int ndim, int want, int writable, Py_buffer *v) {
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: not a C-contiguous%s array (%.100s)", name,
                     writable ? " writable" : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char k = item_kind(v);
    int ok;
    if (want == INT64)
        ok = (k == 'l' || k == 'q') && v->itemsize == 8;
    else if (want == BYTES)
        ok = (k == 'B' || k == '?') && v->itemsize == 1;
    else
        ok = k != '\0' && strchr("bhilq?", k) != NULL &&
             (v->itemsize == 1 || v->itemsize == 2 || v->itemsize == 4 || v->itemsize == 8);
    if (!ok || v->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %d-dimensional array of %s expected, not %d-dimensional of format '%s'",
                     name, ndim, want == INT64 ? "int64" : want == BYTES ? "uint8" : "signed integers",
                     v->ndim, v->format ? v->format : "B");
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static int same_shape(const Py_buffer *v, const char *name, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    const Py_ssize_t want[3] = {a, b, c};
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] != want[d]) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d is %zd, not %zd", name, d, v->shape[d], want[d]);
            return -1;
        }
    return 0;
}

static const char *const field_names[NUM_FIELDS] = {
    "grant", "num_computed_tokens", "status", "run_pos", "wait_key", "admitted", "preempt_order",
    "sampled", "aborted", "hit_tokens", "app_key", "stopped"};

/* Every record (tt[m], ss[m]) inside the chunk, and every id inside the pool
   with the 16 bytes a short id's copy reads: the longest id, or -1 with a
   ValueError. */
static int64_t check_indices(const int64_t *tt, const int64_t *ss, Py_ssize_t M, Py_ssize_t T, Py_ssize_t S,
                             const int64_t *off, const int64_t *len, Py_ssize_t n_ids, Py_ssize_t pool_len) {
    for (Py_ssize_t m = 0; m < M; m++)
        if (tt[m] < 0 || tt[m] >= T || ss[m] < 0 || ss[m] >= S) {
            PyErr_Format(PyExc_ValueError, "tt, ss: record %zd is (%lld, %lld), outside (%zd, %zd)", m,
                         (long long)tt[m], (long long)ss[m], T, S);
            return -1;
        }
    int64_t longest = 0;
    for (Py_ssize_t k = 0; k < n_ids; k++) {
        const int64_t n = len[k] > 0 ? len[k] : 0;
        if (off[k] < 0 || off[k] > pool_len - 16 - n) {
            PyErr_Format(PyExc_ValueError, "id_off, id_len: id %zd (%lld bytes at %lld) not inside the pool of "
                         "%zd bytes with 16 spare", k, (long long)len[k], (long long)off[k], pool_len);
            return -1;
        }
        if (n > longest)
            longest = n;
    }
    return longest;
}

/* The record columns of `columns` (a tuple of NUM_FIELDS arrays or None, the
   status column required) as buffers b[f] (held[f] set) of one shape
   (T, S, R), returned in shape; -1 with an exception otherwise. */
static int get_columns(PyObject *columns, Py_buffer *b, int *held, column *cols, Py_ssize_t *shape) {
    if (PyTuple_GET_SIZE(columns) != NUM_FIELDS) {
        PyErr_Format(PyExc_ValueError, "columns: %d arrays or None expected, not %zd", NUM_FIELDS,
                     PyTuple_GET_SIZE(columns));
        return -1;
    }
    for (int f = 0; f < NUM_FIELDS; f++) {
        PyObject *c = PyTuple_GET_ITEM(columns, f);
        cols[f].data = NULL;
        cols[f].itemsize = 0;
        if (c == Py_None) {
            if (f == STATUS) {
                PyErr_SetString(PyExc_ValueError, "columns: the status column is required");
                return -1;
            }
            continue;
        }
        if (get_buffer(c, field_names[f], 3, ANY_INT, 0, &b[f]) < 0)
            return -1;
        held[f] = 1;
    }
    for (int d = 0; d < 3; d++)
        shape[d] = b[STATUS].shape[d];
    for (int f = 0; f < NUM_FIELDS; f++) {
        if (!held[f])
            continue;
        if (same_shape(&b[f], field_names[f], shape[0], shape[1], shape[2]) < 0)
            return -1;
        cols[f].data = b[f].buf;
        cols[f].itemsize = b[f].itemsize;
    }
    return 0;
}

PyDoc_STRVAR(render_doc,
"render(columns, scal, tt, ss, abort_rank, prefix_rows, async_rows, id_pool, id_off, id_len,\n"
"       first_step, codes, out, ends) -> bytes written\n\n"
"Renders records (tt[m], ss[m]) into out (uint8), one after another; ends[m]\n"
"(int64, len(tt)) is where record m's text ends (a record left out ends where\n"
"the one before it does).  columns: one array (T, S, R) of signed integers or\n"
"None per field, in the order of gpu/trace_native.py FIELDS (status required);\n"
"scal int64 (T, S, 3 or 5 with app_key); tt, ss int64 (M,); abort_rank int64\n"
"(S, R); prefix_rows, async_rows uint8 (S,); id_pool uint8, id_off, id_len\n"
"int64 (S * R,): request code s * R + r is id_pool[id_off:][:id_len], its JSON\n"
"string (id_len < 0: a padding slot), the pool ending in 16 spare bytes;\n"
"codes: RequestStatus (waiting, running, preempted, stopped, length_capped);\n"
"out: at least M * record_bound(R, max(id_len)) bytes.  Every shape, format\n"
"and index is checked: ValueError or TypeError naming the argument.");

static PyObject *py_render(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"columns", "scal", "tt", "ss", "abort_rank", "prefix_rows", "async_rows",
                             "id_pool", "id_off", "id_len", "first_step", "codes", "out", "ends", NULL};
    PyObject *columns, *o_scal, *o_tt, *o_ss, *o_abort, *o_prefix, *o_async, *o_pool, *o_off, *o_len, *o_out,
        *o_ends;
    long long first_step, cw, cr, cp, cs, cl;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOOOOOL(LLLLL)OO:render", kwlist, &PyTuple_Type,
                                     &columns, &o_scal, &o_tt, &o_ss, &o_abort, &o_prefix, &o_async, &o_pool,
                                     &o_off, &o_len, &first_step, &cw, &cr, &cp, &cs, &cl, &o_out, &o_ends))
        return NULL;
    Py_buffer b[NUM_BUFS];
    int held[NUM_BUFS] = {0};
    PyObject *result = NULL;
    column cols[NUM_FIELDS];
#define GET(i, obj, name, ndim, want, writable)                              \
    do {                                                                     \
        if (get_buffer((obj), (name), (ndim), (want), (writable), &b[i]) < 0) \
            goto done;                                                       \
        held[i] = 1;                                                         \
    } while (0)
    Py_ssize_t shape[3];
    if (get_columns(columns, b, held, cols, shape) < 0)
        goto done;
    const Py_ssize_t T = shape[0], S = shape[1], R = shape[2];
    GET(SCAL, o_scal, "scal", 3, INT64, 0);
    const Py_ssize_t ncols = b[SCAL].shape[2];
    if (same_shape(&b[SCAL], "scal", T, S, ncols) < 0)
        goto done;
    if (ncols < (held[APP_KEY] ? 5 : 3)) {
        PyErr_Format(PyExc_ValueError, "scal: %zd columns, not %d", ncols, held[APP_KEY] ? 5 : 3);
        goto done;
    }
    GET(TT, o_tt, "tt", 1, INT64, 0);
    GET(SS, o_ss, "ss", 1, INT64, 0);
    const Py_ssize_t M = b[TT].shape[0];
    GET(ABORT, o_abort, "abort_rank", 2, INT64, 0);
    GET(PREFIX, o_prefix, "prefix_rows", 1, BYTES, 0);
    GET(ASYNC, o_async, "async_rows", 1, BYTES, 0);
    GET(POOL, o_pool, "id_pool", 1, BYTES, 0);
    GET(OFF, o_off, "id_off", 1, INT64, 0);
    GET(LEN, o_len, "id_len", 1, INT64, 0);
    GET(OUT, o_out, "out", 1, BYTES, 1);
    GET(ENDS, o_ends, "ends", 1, INT64, 1);
#undef GET
    if (same_shape(&b[SS], "ss", M, 0, 0) < 0 || same_shape(&b[ABORT], "abort_rank", S, R, 0) < 0 ||
        same_shape(&b[PREFIX], "prefix_rows", S, 0, 0) < 0 || same_shape(&b[ASYNC], "async_rows", S, 0, 0) < 0 ||
        same_shape(&b[OFF], "id_off", S * R, 0, 0) < 0 || same_shape(&b[LEN], "id_len", S * R, 0, 0) < 0 ||
        same_shape(&b[ENDS], "ends", M, 0, 0) < 0)
        goto done;
    const int64_t *tt = b[TT].buf, *ss = b[SS].buf, *off = b[OFF].buf, *len = b[LEN].buf;
    const int64_t max_id_len = check_indices(tt, ss, M, T, S, off, len, S * R, b[POOL].len);
    if (max_id_len < 0)
        goto done;
    const int64_t need = (int64_t)M * record_bound(R, max_id_len);
    if (b[OUT].len < need) {
        PyErr_Format(PyExc_ValueError, "out: %zd bytes, not the %lld that %zd records may take", b[OUT].len,
                     (long long)need, M);
        goto done;
    }
    const codes c = {cw, cr, cp, cs, cl};
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = render(M, tt, ss, S, R, first_step, cols, b[SCAL].buf, ncols, b[ABORT].buf, b[PREFIX].buf,
               b[ASYNC].buf, b[POOL].buf, off, len, max_id_len, c, b[OUT].buf, b[OUT].len, b[ENDS].buf);
    Py_END_ALLOW_THREADS
    if (n < 0)
        PyErr_NoMemory(); /* the room was checked above: only the scratch lists can fail */
    else
        result = PyLong_FromLongLong(n);
done:
    for (int i = 0; i < NUM_BUFS; i++)
        if (held[i])
            PyBuffer_Release(&b[i]);
    return result;
}

PyDoc_STRVAR(record_bound_doc,
"record_bound(R, max_id_len) -> the most bytes render writes for one record of R slots\n"
"whose longest id (as JSON) is max_id_len bytes.");

static PyObject *py_record_bound(PyObject *self, PyObject *args) {
    long long R, max_id_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "LL:record_bound", &R, &max_id_len))
        return NULL;
    if (R < 0 || max_id_len < 0)
        return PyErr_Format(PyExc_ValueError, "record_bound: R and max_id_len must be >= 0");
    return PyLong_FromLongLong(record_bound(R, max_id_len));
}

static PyMethodDef methods[] = {
    {"render", (PyCFunction)(void (*)(void))py_render, METH_VARARGS | METH_KEYWORDS, render_doc},
    {"record_bound", py_record_bound, METH_VARARGS, record_bound_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "trace_render",
    "Per-step records to schedspec.trace/1 text (gpu/trace_render.c; gpu/trace_native.py wraps it).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_trace_render(void) {
    return PyModule_Create(&module);
}
