/* Per-step records to schedspec.trace/1 text, one record after another.

   The native twin of gpu/trace_text.py's numpy renderer (`_render`): the same
   inputs (the record columns of a chunk, (T, S, R) arrays as gpu/batch.py copies
   them from the device), the same text, byte for byte (tests/test_torch_trace_text.py
   compares the two on every flag combination, odd ids and large numbers).  The
   numpy renderer places some 250 pieces of text per step of 32 requests by index
   arithmetic, about 12 us of host time a step; a loop over the records writes the
   same 1.4 kB in well under one.  gpu/trace_native.py compiles this file once per
   source text with the system C compiler and loads it with ctypes; without a
   compiler the numpy renderer runs.

   A record is (step t, scenario row s).  Its text is `,\n{"step": ...}` with the
   keys of reference/engine.py in order (formats.md, Trace); a record with nothing
   to list (an idle step) is left out: its length is 0. */

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

/* The record columns, in this order (gpu/trace_native.py FIELDS). */
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
    char tmp[24];
    char *e = tmp + sizeof(tmp), *b = e;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    while (u >= 100) {
        const unsigned k = (unsigned)(u % 100) * 2;
        u /= 100;
        b -= 2;
        b[0] = digit_pairs[k];
        b[1] = digit_pairs[k + 1];
    }
    if (u >= 10) {
        b -= 2;
        b[0] = digit_pairs[u * 2];
        b[1] = digit_pairs[u * 2 + 1];
    } else {
        *--b = (char)('0' + u);
    }
    if (v < 0)
        *o->p++ = '-';
    memcpy(o->p, b, (size_t)(e - b));
    o->p += e - b;
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
   bytes and every record's room (schedspec_record_bound) has 16 more. */
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

static inline void sep(out_t *o, int *first) {
    if (*first)
        *first = 0;
    else
        PUTS(o, ", ");
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

/* The most bytes one record can take: the keys and five scalars, and per slot
   every list it can be in (ten, with a comma; a number in three, a reason in
   two), and 16 bytes that a short id's copy may write past its end.  An id is
   at least as long as its padding form "null" in quotes. */
int64_t schedspec_record_bound(int64_t R, int64_t max_id_len) {
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
int64_t schedspec_render(int64_t M, const int64_t *tt, const int64_t *ss, int64_t S, int64_t R,
                         int64_t first_step, const column *cols, const int64_t *scal, int64_t ncols,
                         const int64_t *abort_rank, const uint8_t *prefix_rows, const uint8_t *async_rows,
                         const char *id_pool, const int64_t *id_off, const int64_t *id_len,
                         int64_t max_id_len, codes c, char *out, int64_t cap, int64_t *rec_end) {
    const ids_t ids = {id_pool, id_off, id_len};
    const int applied = cols[APP_KEY].data != NULL;
    const int64_t bound = schedspec_record_bound(R, max_id_len);
    const size_t slots = (size_t)(R > 0 ? R : 1);
    keyed *order = malloc(sizeof(keyed) * slots);
    keyed *other = malloc(sizeof(keyed) * slots);
    int64_t *vals = malloc(sizeof(int64_t) * slots * NUM_FIELDS); /* the record's columns */
    if (order == NULL || other == NULL || vals == NULL) {
        free(order);
        free(other);
        free(vals);
        return -1;
    }
#define V(field, slot) vals[(field) * R + (slot)]
    out_t o = {out};
    for (int64_t m = 0; m < M; m++) {
        if ((o.p - out) + bound > cap) {
            free(order);
            free(other);
            free(vals);
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
        /* Running order: the running and granted slots by run_pos. */
        int64_t n_order = 0;
        int busy = is_async && (called != 0 || app_step >= 0);
        for (int64_t r = 0; r < R; r++) {
            const int64_t st = V(STATUS, r);
            const int running = st == c.running;
            const int sched = V(GRANT, r) > 0;
            const int live = st >= c.waiting && st <= c.preempted;
            int stopped;
            if (applied)
                stopped = V(STOPPED, r) != 0;
            else
                stopped = sched && (st == c.stopped || st == c.length_capped);
            busy |= sched | live | (V(ABORTED, r) != 0) | stopped;
            if (running || sched) {
                order[n_order].key = V(RUN_POS, r);
                order[n_order].slot = r;
                n_order++;
            }
        }
        if (!busy) {
            rec_end[m] = o.p - out;
            continue;
        }
        sort_keyed(order, n_order);

        PUTS(&o, ",\n{\"step\": ");
        num(&o, t + first_step);

        PUTS(&o, ", \"scheduled\": [");
        int first = 1;
        for (int64_t i = 0; i < n_order; i++) {
            const int64_t r = order[i].slot, g = V(GRANT, r);
            if (g > 0) {
                sep(&o, &first);
                PUTS(&o, "[");
                item(&o, &ids, code0 + r);
                PUTS(&o, ", ");
                num(&o, g);
                PUTS(&o, "]");
            }
        }
        for (int64_t kind = 1; kind <= 2; kind++) { /* admitted: 1 new, 2 resumed */
            if (kind == 1)
                PUTS(&o, "], \"new\": [");
            else
                PUTS(&o, "], \"resumed\": [");
            first = 1;
            for (int64_t i = 0; i < n_order; i++) {
                const int64_t r = order[i].slot;
                if (V(GRANT, r) > 0 && V(ADMITTED, r) == kind) {
                    sep(&o, &first);
                    item(&o, &ids, code0 + r);
                }
            }
        }

        PUTS(&o, "], \"preempted\": [");
        int64_t n = 0;
        for (int64_t r = 0; r < R; r++) {
            const int64_t k = V(PREEMPT_ORDER, r);
            if (k >= 0) {
                other[n].key = k;
                other[n].slot = r;
                n++;
            }
        }
        sort_keyed(other, n);
        first = 1;
        for (int64_t i = 0; i < n; i++) {
            sep(&o, &first);
            item(&o, &ids, code0 + other[i].slot);
        }

        /* finished: this step's aborts in the scenario's abort order, then the
           requests the update stopped, in the order of the batch applied */
        PUTS(&o, "], \"finished\": [");
        first = 1;
        n = 0;
        for (int64_t r = 0; r < R; r++) {
            if (V(ABORTED, r) != 0) {
                other[n].key = abort_rank[code0 + r];
                other[n].slot = r;
                n++;
            }
        }
        sort_keyed(other, n);
        for (int64_t i = 0; i < n; i++) {
            sep(&o, &first);
            PUTS(&o, "[");
            item(&o, &ids, code0 + other[i].slot);
            PUTS(&o, ", \"aborted\"]");
        }
        n = 0;
        for (int64_t r = 0; r < R; r++) {
            int stopped;
            if (applied)
                stopped = V(STOPPED, r) != 0;
            else {
                const int64_t st = V(STATUS, r);
                stopped = V(GRANT, r) > 0 && (st == c.stopped || st == c.length_capped);
            }
            if (stopped) {
                other[n].key = V(applied ? APP_KEY : RUN_POS, r);
                other[n].slot = r;
                n++;
            }
        }
        sort_keyed(other, n);
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = other[i].slot, st = V(STATUS, r);
            sep(&o, &first);
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
        first = 1;
        for (int64_t i = 0; i < n_order; i++) {
            const int64_t r = order[i].slot;
            if (V(STATUS, r) == c.running) {
                sep(&o, &first);
                item(&o, &ids, code0 + r);
            }
        }

        PUTS(&o, "], \"waiting\": [");
        n = 0;
        for (int64_t r = 0; r < R; r++) {
            const int64_t st = V(STATUS, r);
            if (st >= c.waiting && st <= c.preempted && st != c.running) {
                other[n].key = V(WAIT_KEY, r);
                other[n].slot = r;
                n++;
            }
        }
        sort_keyed(other, n);
        first = 1;
        for (int64_t i = 0; i < n; i++) {
            sep(&o, &first);
            item(&o, &ids, code0 + other[i].slot);
        }

        PUTS(&o, "], \"num_computed_tokens\": {");
        first = 1;
        for (int64_t r = 0; r < R; r++) { /* slot order */
            const int64_t st = V(STATUS, r);
            if (st >= c.waiting && st <= c.preempted) {
                sep(&o, &first);
                key(&o, &ids, code0 + r);
                PUTS(&o, ": ");
                num(&o, V(NCT, r));
            }
        }
        PUTS(&o, "}, \"num_free_blocks\": ");
        num(&o, sc[0]);

        /* sampled: in the order of the batch applied */
        PUTS(&o, ", \"sampled\": [");
        first = 1;
        if (applied) {
            n = 0;
            for (int64_t r = 0; r < R; r++) {
                if (V(SAMPLED, r) != 0) {
                    other[n].key = V(APP_KEY, r);
                    other[n].slot = r;
                    n++;
                }
            }
            sort_keyed(other, n);
            for (int64_t i = 0; i < n; i++) {
                sep(&o, &first);
                item(&o, &ids, code0 + other[i].slot);
            }
        } else {
            for (int64_t i = 0; i < n_order; i++) {
                const int64_t r = order[i].slot;
                if (V(GRANT, r) > 0 && V(SAMPLED, r) != 0) {
                    sep(&o, &first);
                    item(&o, &ids, code0 + r);
                }
            }
        }
        PUTS(&o, "], \"slots_held\": ");
        num(&o, sc[1]);

        if (prefix_rows[s]) {
            /* each admission's hit, in admission (running) order */
            PUTS(&o, ", \"prefix_hits\": {");
            first = 1;
            for (int64_t i = 0; i < n_order; i++) {
                const int64_t r = order[i].slot;
                if (V(GRANT, r) > 0 && V(ADMITTED, r) > 0) {
                    sep(&o, &first);
                    key(&o, &ids, code0 + r);
                    PUTS(&o, ": ");
                    num(&o, V(HIT_TOKENS, r));
                }
            }
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
    free(order);
    free(other);
    free(vals);
    return o.p - out;
}
