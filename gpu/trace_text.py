"""Per-step records to `schedspec.trace/1` text, column by column, and the
torch trace that holds that text (`TorchTrace`).

Building one Python dict per scenario-step bounded a traced torch run at a few
tens of thousands of scenario-steps per second, whatever the device did.  Here
a chunk of steps of every scenario of a batch (numpy arrays (T, S, R), as
gpu/batch.py copies them from the device) becomes the JSON text of its trace
steps directly, by one of two renderers that write the same bytes:

- the native one (gpu/trace_render.c, the C extension built at install time,
  loaded by gpu/trace_native.py; the default wherever it was built): a loop
  over the records in C;
- the numpy one (`_render`): each piece of text ("r3" with its separator, a
  number, a fixed run of keys) is a run of bytes in one byte pool (made once
  per request, per number, per key), the pieces are placed by numpy index
  arithmetic and their bytes gathered in one pass; several times slower
  (a traced run about twice as slow: gpu/README.md).

Either way each scenario's text of the chunk is one view into the chunk's
text: the Python work per chunk is one slice per scenario, none per step or
request.

The text is byte for byte what reference/trace_io.py writes for the same trace
(json.dumps with ", " and ": ", keys in reference/engine.py's order, one step per
line), so a trace is written without being parsed, two traces are equal exactly
when their text is, and a dict (`TorchTrace.to_dict`) is parsed from the text
only where one is wanted: by `run_batch`'s callers, or for a scenario whose text
differs from the spec's (gpu/campaign.py), to build the divergence report.
"""

from __future__ import annotations

import json
import mmap
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from schedspec.reference.engine import TRACE_FORMAT
from schedspec.reference.trace_io import TraceWriter, write_trace

from schedspec.spec.request import RequestStatus

from . import trace_native

# gpu/state.py's status codes (vLLM's), named here without importing torch:
# gpu/campaign.py imports this module, and the command line imports that
# before it knows whether torch runs.
WAITING, RUNNING, PREEMPTED = int(RequestStatus.WAITING), int(RequestStatus.RUNNING), int(RequestStatus.PREEMPTED)
STOPPED, LENGTH_CAPPED = int(RequestStatus.FINISHED_STOPPED), int(RequestStatus.FINISHED_LENGTH_CAPPED)

_LAST = 2**62  # a sort key after every real one


def dumps(value: Any) -> str:
    """json.dumps as trace_io.py writes a step: ", " and ": " separators, ASCII."""
    return json.dumps(value, separators=(", ", ": "))


# A string of printable ASCII without '"' or '\\' is its own JSON text between quotes.
_PLAIN = re.compile(r'[ !#-\[\]-~]*')


def quote(text: str) -> str:
    """`dumps` of a string, without the encoder for the usual plain ids."""
    return f'"{text}"' if _PLAIN.fullmatch(text) else dumps(text)


# All text is ASCII (ids are JSON-escaped with ensure_ascii), so a piece of text
# is a run of bytes in one byte pool, (offset, length), and a chunk's text is
# one gather of bytes: numbers, not Python objects, move until the final join.
#
# The pool: the fixed runs of keys, then every number below _NUM_LIMIT written
# as "0]1]2]...", so number v is (NUM_OFF[v], NUM_LEN[v]) and v followed by
# "]" is one byte longer; then, per batch, each request id q twice, as
# `, ["q", ` and `, "q": `, from which each place an id appears is a slice
# (IdTables).  Numbers outside the table (very large
# pools) are written per chunk into a short tail of the pool.
_NUM_LIMIT = 1 << 17
_WORD = 16  # bytes _gather moves at a time
_FIXED = [',\n{"step": ', ', "scheduled": [', '], "new": [', '], "resumed": [', '], "preempted": [',
          '], "finished": [', '], "running": [', '], "waiting": [', '], "num_computed_tokens": {',
          '}, "num_free_blocks": ', ', "sampled": [', '], "slots_held": ', ', "prefix_hits": {', '}',
          ', "schedule_called": ', ', "applied_step": ', 'true', 'false', 'null', '"aborted"]',
          '"stopped"]', '"length"]']


def _base_pool() -> tuple[bytes, dict[str, tuple[int, int]], np.ndarray, np.ndarray]:
    fixed: dict[str, tuple[int, int]] = {}
    parts, at = [], 0
    for text in _FIXED:
        fixed[text] = (at, len(text))
        parts.append(text)
        at += len(text)
    nums = [str(i) for i in range(_NUM_LIMIT)]
    lengths = np.array([len(x) for x in nums], dtype=np.int64)
    offsets = at + np.cumsum(lengths + 1) - (lengths + 1)
    parts.append("".join(x + "]" for x in nums))
    return "".join(parts).encode("ascii"), fixed, offsets, lengths


_POOL = b""
_FIXED_AT: dict[str, tuple[int, int]] = {}
_NUM_OFF = _NUM_LEN = _REASON_AT = np.zeros(0, dtype=np.int64)


def _make_pool() -> None:
    """The base pool, made at the first batch that records steps (about 50 ms)."""
    global _POOL, _FIXED_AT, _NUM_OFF, _NUM_LEN, _REASON_AT
    if _POOL:
        return
    pool, _FIXED_AT, _NUM_OFF, _NUM_LEN = _base_pool()
    _REASON_AT = np.zeros((max(STOPPED, LENGTH_CAPPED) + 1, 2), dtype=np.int64)
    _REASON_AT[STOPPED] = _FIXED_AT['"stopped"]']
    _REASON_AT[LENGTH_CAPPED] = _FIXED_AT['"length"]']
    _POOL = pool


class IdTables:
    """The byte pool of a batch's rows (the base pool and each request id, row
    s, slot r at code s * R + r), and each request's position in its scenario's
    abort list.  A padding slot (no request) reads `null` where an id would be,
    as json.dumps writes None: only a broken implementation puts one in a trace."""

    def __init__(self, quoted: Sequence[Sequence[str]], abort_rank: Sequence[Sequence[int]], R: int):
        _make_pool()
        S = len(quoted)
        self.R = R
        ranks = np.zeros((S, R), dtype=np.int64)
        qlen = np.full(S * R, -1, dtype=np.int64)  # -1: padding
        texts = []
        for s, q in enumerate(quoted):
            ranks[s, : len(abort_rank[s])] = abort_rank[s]
            qlen[s * R: s * R + len(q)] = [len(x) for x in q]
            texts.extend(f', [{x}, , {x}: ' for x in q)
        self.abort_rank = ranks
        real = qlen >= 0
        sizes = np.where(real, 2 * qlen + 9, 0)
        at = len(_POOL) + np.cumsum(sizes) - sizes  # where `, ["q", ` starts; `, "q": ` follows it
        pad = len(_POOL) + int(sizes.sum())
        pad_text = ', [null, , null, "null": '
        # per code, the text the item, key and pair forms are cut from, and the length of q in it
        self.item_at = np.where(real, at + qlen + 5, pad + 9)  # `, q`
        self.item_q = np.where(real, qlen, 4)
        self.key_at = np.where(real, at + qlen + 5, pad + 15)  # `, q: `
        self.key_q = np.where(real, qlen, 6)
        self.pair_at = np.where(real, at, pad)  # `, [q, `
        self.pair_q = np.where(real, qlen, 4)
        # zero bytes at the end: a word read at the last piece stays inside (_gather)
        self.pool = np.frombuffer(_POOL + "".join(texts).encode("ascii") + pad_text.encode("ascii") + bytes(_WORD),
                                  dtype=np.uint8)
        # the native renderer's form: each id's JSON string once (id_len -1: padding)
        self.id_len = qlen
        self.id_off = np.cumsum(np.maximum(qlen, 0)) - np.maximum(qlen, 0)
        # (16 spare bytes at the end: the renderer copies a short id as one 16-byte word)
        self.id_pool = np.frombuffer("".join(x for q in quoted for x in q).encode("ascii") + bytes(16),
                                     dtype=np.uint8)
        self.max_id_len = int(qlen.max()) if len(qlen) else 0
        self.scratch: np.ndarray | None = None  # the native renderer's buffer (_render_native)

    # (offset, length) of each form, first in its list or after a comma (`later`):
    #   item  "q" / , "q"      key  "q": / , "q":      pair  ["q",  / , ["q",
    def item(self, code: np.ndarray, later: np.ndarray):
        return self.item_at[code] + 2 * ~later, self.item_q[code] + 2 * later

    def key(self, code: np.ndarray, later: np.ndarray):
        return self.key_at[code] + 2 * ~later, self.key_q[code] + 2 + 2 * later

    def pair(self, code: np.ndarray, later: np.ndarray):
        return self.pair_at[code] + 2 * ~later, self.pair_q[code] + 3 + 2 * later


def _numbers(values: np.ndarray, closed: bool, tail: list[str], tail_at: list[int]):
    """(offset, length) of each number (followed by "]" when `closed`); numbers
    outside the table go to the chunk's pool tail."""
    values = np.asarray(values, dtype=np.int64)
    inside = (values >= 0) & (values < _NUM_LIMIT)
    v = np.where(inside, values, 0)
    off, length = _NUM_OFF[v], _NUM_LEN[v] + closed
    if not inside.all():
        out = np.nonzero(~inside)[0]
        for i, x in zip(out.tolist(), values[out].tolist()):
            text = f"{x}]" if closed else str(x)
            off[i], length[i] = tail_at[0], len(text)
            tail.append(text)
            tail_at[0] += len(text)
    return off, length


class _Pieces:
    """A chunk's text as pieces of the pool placed by record: segments added in
    text order, each a run of pieces per record (`rec` ascending); `join` lays
    every record out as its segments in order, gathers the bytes and cuts each
    scenario's records out."""

    def __init__(self, M: int, ids: IdTables):
        self.M = M
        self.ids = ids
        self.segments: list[tuple[np.ndarray | None, Any, Any]] = []
        self.tail: list[str] = []  # numbers outside the table
        self.tail_at = [len(ids.pool) - _WORD]  # the tail replaces the padding

    def fixed(self, text: str, rec: np.ndarray | None = None) -> None:
        """`text` once in each record (or in records `rec`), as pieces of at
        most one word (_gather)."""
        off, length = _FIXED_AT[text]
        for k in range(0, length, _WORD):
            self.segments.append((rec, off + k, min(_WORD, length - k)))

    def numbers(self, values: np.ndarray, rec: np.ndarray | None = None, closed: bool = False) -> None:
        """A number per record (or per element of records `rec`)."""
        off, length = _numbers(values, closed, self.tail, self.tail_at)
        self.segments.append((rec, off, length))

    def run(self, rec: np.ndarray, off: np.ndarray, length: np.ndarray) -> None:
        """Pieces of records `rec` (ascending), in order within a record."""
        self.segments.append((rec, off, length))

    def join(self, scen: np.ndarray) -> list[tuple[int, memoryview, int]]:
        """(scenario row, its text as ASCII bytes, its record count) per
        scenario in `scen` (each record's scenario row, ascending)."""
        M = self.M
        counts = np.zeros((len(self.segments), M), dtype=np.int64)
        for j, (rec, _, _) in enumerate(self.segments):
            if rec is None:
                counts[j] = 1
            elif len(rec):
                counts[j] = np.bincount(rec, minlength=M)
        per_record = counts.sum(0)
        start = np.cumsum(per_record) - per_record
        within = np.cumsum(counts, axis=0) - counts  # each segment's offset inside its record
        n = int(per_record.sum())
        offs = np.empty(n, dtype=np.int64)
        lens = np.empty(n, dtype=np.int64)
        for j, (rec, off, length) in enumerate(self.segments):
            if rec is None:
                pos = start + within[j]
            elif len(rec):
                first = np.cumsum(counts[j]) - counts[j]  # the segment's first piece of each record
                pos = start[rec] + within[j, rec] + np.arange(len(rec)) - first[rec]
            else:
                continue
            offs[pos] = off
            lens[pos] = length
        pool = self.ids.pool
        if self.tail:
            pool = np.frombuffer(pool[:-_WORD].tobytes() + "".join(self.tail).encode("ascii") + bytes(_WORD),
                                 dtype=np.uint8)
        text, ends = _gather(pool, offs, lens)
        whole = memoryview(text.tobytes())
        # records are scenario-major: one slice per scenario
        cuts = np.nonzero(np.diff(scen))[0] + 1
        lo = np.concatenate([[0], cuts])
        hi = np.concatenate([cuts, [M]])
        rec_start = np.append(ends - lens, ends[-1] if n else 0)[np.append(start, n)]  # byte start of each record
        return [(s, whole[a:b], k)
                for s, a, b, k in zip(scen[lo].tolist(), rec_start[lo].tolist(), rec_start[hi].tolist(),
                                      (hi - lo).tolist())]


def _gather(pool: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes pool[offs[k]:offs[k] + lens[k]] of every piece k, one after the
    other (and each piece's end in them).

    A word of 16 bytes moves at a time: each piece (cut into words if longer:
    long ids, huge numbers) is read from the pool as one word at its unaligned
    offset and written at its place in the text, in order, so that the bytes a
    word carries past its piece's end are overwritten by the next word.  One
    copy per piece, not an index per byte (three times faster)."""
    ends = np.cumsum(lens)
    n = len(lens)
    total = int(ends[-1]) if n else 0
    starts = ends - lens
    words = (lens + _WORD - 1) // _WORD
    if n and int(words.max()) > 1:
        nw = np.cumsum(words)
        k = np.arange(int(nw[-1])) - np.repeat(nw - words, words)
        k *= _WORD
        src_at = np.repeat(offs, words) + k
        dst_at = np.repeat(starts, words) + k
    else:
        src_at, dst_at = offs, starts
    # the pool ends in _WORD zero bytes, so a word read at any piece stays inside
    src = np.ndarray(shape=(len(pool) - _WORD + 1,), dtype=f"V{_WORD}", buffer=pool, strides=(1,))
    out = np.zeros(total + _WORD, dtype=np.uint8)
    dst = np.ndarray(shape=(total + 1,), dtype=f"V{_WORD}", buffer=out, strides=(1,))
    # In index order (numpy's 1-D integer assignment walks the indices in order;
    # tests/test_torch_trace_text.py checks it against a byte-by-byte gather):
    # a later word overwrites what an earlier one carried past its end.
    dst[dst_at] = src[src_at]
    return out[:total], ends


def _later(rec: np.ndarray, M: int, extra: np.ndarray | None = None) -> np.ndarray:
    """Whether each element (records `rec` ascending) comes after another of its list."""
    counts = np.bincount(rec, minlength=M)
    first = np.cumsum(counts) - counts
    rank = np.arange(len(rec)) - first[rec]
    if extra is not None:
        rank = rank + extra[rec]
    return rank > 0


def _pairs(rec: np.ndarray, a: tuple, b: tuple):
    """Two pieces per element, a then b: (records, offsets, lengths)."""
    off = np.empty(2 * len(rec), dtype=np.int64)
    length = np.empty(2 * len(rec), dtype=np.int64)
    off[0::2], length[0::2] = a
    off[1::2], length[1::2] = b
    return np.repeat(rec, 2), off, length


def render_chunk(rec: dict[str, np.ndarray], first_step: int, scal: np.ndarray, ids: IdTables,
                 prefix_rows: np.ndarray, async_rows: np.ndarray,
                 transient: bool = False) -> list[tuple[int, memoryview, int]]:
    """The trace text of one chunk of steps: (batch row, text, steps listed) per
    scenario with a listed step in the chunk, the text as ASCII bytes (a view
    into the chunk's text: no copy per scenario).  `rec` holds each record
    field as an array (T, S, R), `scal` (T, S, 3 or 5) the free blocks, slots held and
    active flag (and, in a batch with async scheduling, whether schedule() was
    called and the step of the batch applied, -1 = none); `prefix_rows` and
    `async_rows` (S,) which rows have prefix caching and async scheduling.

    A step's text is `,\n{"step": ...}` (the writer drops the first `,\n` of a
    trace); idle steps are left out (engine.is_idle_record, formats.md Trace).

    The records go through in slices of about 2**18 pieces: every array of a
    slice stays a few MB, where a whole chunk's (tens of millions of pieces at
    S = 8192) would be fresh memory, page-faulted in, each time (that made the
    first version of this code slower than the dicts).

    `transient`: the texts may be views into a buffer the next call reuses
    (the native renderer's scratch, not copied out), for a caller that writes
    them out before it renders the next chunk."""
    R = rec["status"].shape[2]
    ss, tt = np.nonzero(scal[:, :, 2].T)  # scenario-major, each scenario's steps in order
    if trace_native.available():
        return _render_native(rec, first_step, scal, ids, prefix_rows, async_rows, ss, tt, transient)
    size = max(64, _SLICE_PIECES // (8 * R + 32))
    out: list[tuple[int, memoryview, int]] = []
    for a in range(0, len(ss), size):
        out += _render(rec, first_step, scal, ids, prefix_rows, async_rows, ss[a:a + size], tt[a:a + size])
    return out


_SLICE_PIECES = 1 << 18
_POPULATED = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


def _render_native(rec, first_step, scal, ids, prefix_rows, async_rows, ss, tt,
                   transient: bool = False) -> list[tuple[int, memoryview, int]]:
    """render_chunk through gpu/trace_render.c, in one call.

    The renderer writes into a scratch buffer kept with the id tables, with
    room for every record's worst case (trace_native.record_bound, about four
    times the real text) and reused chunk after chunk, so its pages are
    already mapped; the text is then copied once into an anonymous mapping of
    its exact size, populated in one call (MAP_POPULATE: measured 0.38 against
    0.6 us per kB for fresh pages faulted in one by one as the text reaches
    them), and each scenario's text is a view into that mapping; `transient`
    leaves the text in the scratch buffer (render_chunk)."""
    if len(ss) == 0:
        return []
    R = rec["status"].shape[2]
    need = len(ss) * trace_native.record_bound(R, ids.max_id_len)
    if ids.scratch is None or len(ids.scratch) < need:
        # an anonymous mapping, not np.empty: numpy asks for huge pages on large
        # arrays, and a huge page fault can wait on memory compaction (measured:
        # three times slower here)
        ids.scratch = np.frombuffer(mmap.mmap(-1, need), dtype=np.uint8)
    codes = (WAITING, RUNNING, PREEMPTED, STOPPED, LENGTH_CAPPED)
    n, ends = trace_native.render(rec, first_step, scal, tt, ss, ids.abort_rank, prefix_rows, async_rows,
                                  ids.id_pool, ids.id_off, ids.id_len, codes, ids.scratch)
    if transient:
        room = ids.scratch
    else:
        room = mmap.mmap(-1, max(n, 1), flags=_POPULATED)
        room[:n] = memoryview(ids.scratch)[:n]
    starts = np.concatenate([[0], ends[:-1]])
    listed = (ends > starts).astype(np.int64)
    cuts = np.nonzero(np.diff(ss))[0] + 1  # records are scenario-major: one text per scenario
    lo = np.concatenate([[0], cuts])
    hi = np.concatenate([cuts, [len(ss)]])
    counts = np.add.reduceat(listed, lo)
    view = memoryview(room)
    return [(s, view[b:e], k)
            for s, b, e, k in zip(ss[lo].tolist(), starts[lo].tolist(), ends[hi - 1].tolist(), counts.tolist()) if k]


class _Records:
    """The records (tt, ss) of a slice that list something (idle ones left
    out), with the masks and orders their lists are cut from, per record and
    slot (M, R), and how a list's elements become pieces of text."""

    def __init__(self, rec, scal, ids: IdTables, async_rows, ss, tt):
        status, grant = rec["status"][tt, ss], rec["grant"][tt, ss]
        running = status == RUNNING
        sched = grant > 0
        live = (status >= WAITING) & (status <= PREEMPTED)
        waiting = live & ~running
        aborted = rec["aborted"][tt, ss]
        self.applied = applied = "app_key" in rec  # async in the batch: the batch applied has its own grant order
        if applied:
            stopped = rec["stopped"][tt, ss]
        else:
            stopped = sched & ((status == STOPPED) | (status == LENGTH_CAPPED))
        busy = sched.any(1) | running.any(1) | waiting.any(1) | aborted.any(1) | stopped.any(1)
        called = app_step = None
        if applied:
            called, app_step = scal[tt, ss, 3].astype(bool), scal[tt, ss, 4]
            busy |= async_rows[ss] & (called | (app_step >= 0))
        keep = np.nonzero(busy)[0]
        self.M = M = len(keep)
        if M == 0:  # nothing to list: _render writes nothing
            return
        if M < len(ss):
            ss, tt = ss[keep], tt[keep]
            status, grant, running, sched, live, waiting, aborted, stopped = (
                x[keep] for x in (status, grant, running, sched, live, waiting, aborted, stopped))
            if applied:
                called, app_step = called[keep], app_step[keep]
        self.ss, self.tt, self.ids = ss, tt, ids
        self.status, self.grant, self.running, self.sched = status, grant, running, sched
        self.live, self.waiting, self.aborted, self.stopped = live, waiting, aborted, stopped
        self.called, self.app_step = called, app_step
        self.rows = np.arange(M)[:, None]
        self.base = ss * rec["status"].shape[2]  # a request's code in the id tables: base + slot
        # Running order (run_pos) for the running list and the grants; the waiting
        # queue's pop order for waiting.  Both keys are unique among their members.
        self.run_pos = rec["run_pos"][tt, ss]
        self.order_r = np.argsort(np.where(running | sched, self.run_pos, _LAST), axis=1, kind="stable")
        self.sched_o = sched[self.rows, self.order_r]
        self.admitted_o = rec["admitted"][tt, ss][self.rows, self.order_r]
        self.app_key = rec["app_key"][tt, ss] if applied else None

    def field(self, rec, name: str) -> np.ndarray:
        """Record field `name` of these records, (M, R)."""
        return rec[name][self.tt, self.ss]

    def listed(self, kind, rr: np.ndarray, slot: np.ndarray, extra=None):
        """(offset, length) of the id texts of (record rr, slot), with a comma
        before all but the first of its list; `kind` an IdTables form."""
        return kind(self.base[rr] + slot, _later(rr, self.M, extra))

    def in_running_order(self, member: np.ndarray):
        """(record, slot) of the members (already in running order, as
        order_r puts the slots) in running order, record by record."""
        rr, k = np.nonzero(member)
        return rr, self.order_r[rr, k]

    def ordered(self, key: np.ndarray, member: np.ndarray):
        """(record, slot) of the members in key order, record by record."""
        order = np.argsort(np.where(member, key, _LAST), axis=1, kind="stable")
        rr, k = np.nonzero(member[self.rows, order])
        return rr, order[rr, k]

    @staticmethod
    def sparse_ordered(key: np.ndarray, member: np.ndarray):
        """`ordered` for a member mask that few records have (preemptions, aborts)."""
        some = np.nonzero(member.any(1))[0]
        if len(some) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        sub = member[some]
        order = np.argsort(np.where(sub, key[some], _LAST), axis=1, kind="stable")
        r, k = np.nonzero(sub[np.arange(len(some))[:, None], order])
        return some[r], order[r, k]


def _render(rec, first_step, scal, ids, prefix_rows, async_rows, ss, tt) -> list[tuple[int, memoryview, int]]:
    """render_chunk for the records (tt, ss), scenario-major: the numpy renderer."""
    c = _Records(rec, scal, ids, async_rows, ss, tt)
    if c.M == 0:
        return []
    P = _Pieces(c.M, ids)
    P.fixed(',\n{"step": ')
    P.numbers(c.tt + first_step)
    _render_grants(P, c)
    _render_finished(P, c, rec)
    _render_state(P, c, rec, scal)
    _render_flags(P, c, rec, prefix_rows, async_rows)
    P.fixed("}")
    return P.join(c.ss)


def _render_grants(P: _Pieces, c: _Records) -> None:
    """scheduled (with each grant), new and resumed, in running order; preempted."""
    ids = c.ids
    P.fixed(', "scheduled": [')
    rr, slot = c.in_running_order(c.sched_o)
    if len(rr):
        P.run(*_pairs(rr, c.listed(ids.pair, rr, slot),
                      _numbers(c.grant[rr, slot], True, P.tail, P.tail_at)))
    for name, code in (("new", 1), ("resumed", 2)):
        P.fixed(f'], "{name}": [')
        rr, slot = c.in_running_order(c.sched_o & (c.admitted_o == code))
        if len(rr):
            P.run(rr, *c.listed(ids.item, rr, slot))


def _render_finished(P: _Pieces, c: _Records, rec) -> None:
    """preempted in preemption order; finished: this step's aborts in the
    scenario's abort order, then the requests the update stopped, in the order
    of the batch applied."""
    ids = c.ids
    P.fixed('], "preempted": [')
    preempt = c.field(rec, "preempt_order")
    rr, slot = c.sparse_ordered(preempt, preempt >= 0)
    if len(rr):
        P.run(rr, *c.listed(ids.item, rr, slot))
    P.fixed('], "finished": [')
    ra, sa = c.sparse_ordered(ids.abort_rank[c.ss], c.aborted)
    rs, slot_s = c.sparse_ordered(c.app_key if c.applied else c.run_pos, c.stopped)
    if len(ra):
        at, length = _FIXED_AT['"aborted"]']
        P.run(*_pairs(ra, c.listed(ids.pair, ra, sa), (np.full(len(ra), at), np.full(len(ra), length))))
    if len(rs):
        reason = _REASON_AT[c.status[rs, slot_s]]
        P.run(*_pairs(rs, c.listed(ids.pair, rs, slot_s, np.bincount(ra, minlength=c.M)),
                      (reason[:, 0], reason[:, 1])))


def _render_state(P: _Pieces, c: _Records, rec, scal) -> None:
    """running, waiting, num_computed_tokens, num_free_blocks, sampled, slots_held."""
    ids = c.ids
    P.fixed('], "running": [')
    rr, slot = c.in_running_order(c.running[c.rows, c.order_r])
    if len(rr):
        P.run(rr, *c.listed(ids.item, rr, slot))
    P.fixed('], "waiting": [')
    rr, slot = c.ordered(c.field(rec, "wait_key"), c.waiting)
    if len(rr):
        P.run(rr, *c.listed(ids.item, rr, slot))
    P.fixed('], "num_computed_tokens": {')
    rr, slot = np.nonzero(c.live)  # scenario order
    if len(rr):
        P.run(*_pairs(rr, c.listed(ids.key, rr, slot),
                      _numbers(c.field(rec, "num_computed_tokens")[rr, slot], False, P.tail, P.tail_at)))
    P.fixed('}, "num_free_blocks": ')
    P.numbers(scal[c.tt, c.ss, 0])
    # sampled: in the order of the batch applied
    P.fixed(', "sampled": [')
    sampled = c.field(rec, "sampled")
    if c.applied:
        rr, slot = c.ordered(c.app_key, sampled)
    else:
        rr, slot = c.in_running_order(c.sched_o & sampled[c.rows, c.order_r])
    if len(rr):
        P.run(rr, *c.listed(ids.item, rr, slot))
    P.fixed('], "slots_held": ')
    P.numbers(scal[c.tt, c.ss, 1])


def _render_flags(P: _Pieces, c: _Records, rec, prefix_rows, async_rows) -> None:
    """prefix_hits (rows with prefix caching); schedule_called and applied_step
    (rows with async scheduling)."""
    has_prefix = prefix_rows[c.ss]
    if has_prefix.any():
        # prefix_hits: each admission's hit, in admission (running) order
        pre = np.nonzero(has_prefix)[0]
        P.fixed(', "prefix_hits": {', pre)
        rr, slot = c.in_running_order(c.sched_o & (c.admitted_o > 0) & has_prefix[:, None])
        if len(rr):
            P.run(*_pairs(rr, c.listed(c.ids.key, rr, slot),
                          _numbers(c.field(rec, "hit_tokens")[rr, slot], False, P.tail, P.tail_at)))
        P.fixed("}", pre)
    if not c.applied:
        return
    asy = np.nonzero(async_rows[c.ss])[0]
    if len(asy):
        P.fixed(', "schedule_called": ', asy)
        t_at, f_at = _FIXED_AT["true"], _FIXED_AT["false"]
        called = c.called[asy]
        P.run(asy, np.where(called, t_at[0], f_at[0]), np.where(called, t_at[1], f_at[1]))
        P.fixed(', "applied_step": ', asy)
        a = c.app_step[asy]
        off, length = _numbers(np.maximum(a, 0), False, P.tail, P.tail_at)
        none = a < 0
        off[none], length[none] = _FIXED_AT["null"]
        P.run(asy, off, length)


def trace_header(scenario: str, implementation: str) -> dict[str, str]:
    """The fields a trace file starts with (trace_io.py's layout)."""
    return {"format": TRACE_FORMAT, "scenario": scenario, "implementation": implementation}


class TorchTrace:
    """One scenario's torch trace: the header, the steps as trace text (ASCII
    bytes in pieces, as the renderer made them, joined on demand), and the
    summary; or, for an error or crash trace, the dict itself (`from_dict`).

    - `num_steps`: the steps listed;
    - `steps_text()`: the steps as trace_io.py writes them (one per line,
      ",\\n" between them), "" when there are none;
    - `to_dict()`: the trace as reference.engine.run_scenario returns it;
    - `write(path)`: the trace file (gzip when the name ends in .gz), byte for
      byte what trace_io.write_trace(to_dict(), path) writes;
    - `header`: format, scenario, implementation; `summary`, `error`, `crash`:
      those fields of the trace, or None."""

    __slots__ = ("header", "summary", "num_steps", "_parts", "_dict")

    def __init__(self, scenario: str, implementation: str, parts: Sequence[str | bytes | memoryview],
                 num_steps: int, summary: dict[str, Any] | None):
        self.header = trace_header(scenario, implementation)
        self._parts = [p.encode("ascii") if isinstance(p, str) else p for p in parts]
        self.num_steps = num_steps
        self.summary = summary
        self._dict: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, trace: dict[str, Any]) -> "TorchTrace":
        """A trace already built as a dict (error and crash traces; tests)."""
        t = cls(trace.get("scenario", "?"), trace.get("implementation", "?"), [], len(trace.get("steps", [])),
                trace.get("summary"))
        t._dict = trace
        return t

    @property
    def error(self) -> str | None:
        return self._dict.get("error") if self._dict is not None else None

    @property
    def crash(self) -> str | None:
        return self._dict.get("crash") if self._dict is not None else None

    @property
    def is_text(self) -> bool:
        """Whether the steps are held as text (not a dict from `from_dict`)."""
        return self._dict is None

    @property
    def is_run(self) -> bool:
        """A trace of a run (steps and summary), not an error or crash trace."""
        return self.summary is not None and self.error is None and self.crash is None

    def steps_text(self) -> str:
        if self._dict is not None:
            return ",\n".join(map(dumps, self._dict.get("steps", [])))
        if len(self._parts) != 1:  # join once, keep the result
            self._parts = [b"".join(self._parts)]
        return str(memoryview(self._parts[0])[2:], "ascii")  # without the first step's ",\n"

    def to_dict(self) -> dict[str, Any]:
        if self._dict is not None:
            return self._dict
        text = self.steps_text()
        steps = json.loads("[" + text + "]") if text else []
        return {**self.header, "steps": steps, "summary": self.summary}

    def write(self, path: str | Path) -> Path:
        if self._dict is not None:
            return write_trace(self._dict, path)
        with TraceWriter(path) as w:
            w.begin(self.header)
            if self.num_steps:  # the pieces as they are: no joined copy of the whole text
                w.step_text([memoryview(self._parts[0])[2:], *self._parts[1:]], self.num_steps)
            w.end({**self.header, "summary": self.summary})
        return Path(path)


__all__ = ["IdTables", "TorchTrace", "dumps", "render_chunk", "trace_header"]
