"""The lift's bridges over vLLM 0.34.0's changed structures, on stand-in objects
shaped as each release's (no vLLM needed): the output without resumed_req_ids,
the model runner's output without req_id_to_index, the prefix-cache map of block
ids, the queue of requests that may load asynchronously, and the prefix-cache hit
limit that replaced skip_reading_prefix_cache.  The real releases run the same
paths in tests/test_vllm_releases.py."""

from __future__ import annotations

from types import SimpleNamespace

from schedspec.reference import vllm_lift


def new_data(rid: str, computed: int) -> SimpleNamespace:
    return SimpleNamespace(req_id=rid, num_computed_tokens=computed)


def test_output_of_0_34_sends_every_admission_as_new():
    """0.34.0's CachedRequestData has no resumed_req_ids (sched/output.py:139-158): every
    admission, a resumed one too, is a new request, with its prefix hit in NewRequestData."""
    out = SimpleNamespace(
        num_scheduled_tokens={"run": 1, "fresh": 16, "back": 32},
        scheduled_new_reqs=[new_data("fresh", 0), new_data("back", 16)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["run"], num_computed_tokens=[40]),
        preempted_req_ids=set())
    lifted = vllm_lift.lift_output(out, [], prefix_caching=True)
    assert lifted.scheduled_new_reqs == ("fresh", "back")
    assert lifted.scheduled_resumed_reqs == ()
    assert lifted.scheduled_running_reqs == ("run",)
    assert lifted.prefix_hits == (("fresh", 0), ("back", 16))


def test_output_of_0_33_keeps_resumed_requests_apart():
    """Up to 0.33.0 a resumed request travels among the cached ones, named in resumed_req_ids."""
    out = SimpleNamespace(
        num_scheduled_tokens={"run": 1, "fresh": 16, "back": 32},
        scheduled_new_reqs=[new_data("fresh", 0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["run", "back"], resumed_req_ids={"back"},
                                              num_computed_tokens=[40, 16]),
        preempted_req_ids=set())
    lifted = vllm_lift.lift_output(out, [], prefix_caching=True)
    assert (lifted.scheduled_new_reqs, lifted.scheduled_resumed_reqs) == (("fresh",), ("back",))
    assert lifted.prefix_hits == (("fresh", 0), ("back", 16))


def test_sampled_tokens_by_position_without_an_index():
    """0.34.0's ModelRunnerOutput has no req_id_to_index: a request's row is its place in req_ids."""
    mro = SimpleNamespace(req_ids=["b", "a"], sampled_token_ids=[[7], [8, 9]])
    assert vllm_lift.sampled_tokens(mro, ["a", "b", "c"]) == {"a": [8, 9], "b": [7], "c": []}
    old = SimpleNamespace(req_ids=["b", "a"], req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[8, 9], [7]])
    assert vllm_lift.sampled_tokens(old, ["a", "b"]) == {"a": [8, 9], "b": [7]}


class Pool(SimpleNamespace):
    pass


def test_hash_map_of_block_ids_with_duplicates():
    """0.34.0's map holds a block id per hash and the ids of a hash several blocks hold
    in `_dup_ids` (block_pool.py:55-104); the lifted map follows a change of either."""
    h1, h2 = b"h1" + b"\0" * 4, b"h2" + b"\0" * 4  # hash + 4-byte group id
    hmap = SimpleNamespace(_cache={h1: 3, h2: 5}, _dup_ids={})
    pool = Pool(cached_block_hash_to_block=hmap)
    cached, block_hash = vllm_lift.lift_hash_map(pool)
    assert cached == {b"h1": (3,), b"h2": (5,)} and block_hash == {3: b"h1", 5: b"h2"}
    hmap._dup_ids[h2] = {5: None, 9: None}  # a second block cached under h2; _cache unchanged
    cached, block_hash = vllm_lift.lift_hash_map(pool)
    assert cached == {b"h1": (3,), b"h2": (5, 9)} and block_hash == {3: b"h1", 5: b"h2", 9: b"h2"}
    del hmap._dup_ids[h2]
    hmap._cache[h2] = 9  # block 5 popped: the other one stands for the hash
    cached, _ = vllm_lift.lift_hash_map(pool)
    assert cached == {b"h1": (3,), b"h2": (9,)}


class Req:
    def __init__(self, rid: str, arrival: float, priority: int = 0):
        self.request_id, self.arrival_time, self.priority = rid, arrival, priority

    def __lt__(self, other: "Req") -> bool:  # as vLLM's Request.__lt__ (request.py:409-419)
        return (self.priority, self.arrival_time, self.request_id) < (other.priority, other.arrival_time,
                                                                      other.request_id)


def test_async_kv_waiting_merged_in_pop_order():
    """0.34.0's queue of requests that may load asynchronously (scheduler.py:235-238) is
    popped against `waiting` head by head (:2830-2840): by arrival under FCFS, the
    waiting head on a tie; by priority order under PRIORITY."""
    w = [Req("w1", 1.0), Req("w2", 3.0)]
    p = [Req("p1", 1.0), Req("p2", 2.0), Req("p3", 5.0)]
    merged = vllm_lift.merge_queues(w, p, priority=False)
    assert [r.request_id for r in merged] == ["w1", "p1", "p2", "w2", "p3"]
    w = [Req("w1", 1.0, priority=2)]
    p = [Req("p1", 2.0, priority=1)]
    assert [r.request_id for r in vllm_lift.merge_queues(w, p, priority=True)] == ["p1", "w1"]
    sched = SimpleNamespace(kv_holding_waiting=[Req("h", 0.0)], waiting=[Req("w1", 1.0)],
                            async_kv_waiting=[Req("p0", 0.5)],
                            scheduler_config=SimpleNamespace(policy="fcfs"))
    assert vllm_lift.waiting_order(sched) == ("h", "p0", "w1")


def test_prefix_cache_hit_limit_lifts_as_the_skip_flag():
    """0.34.0 replaced skip_reading_prefix_cache by prefix_cache_hit_limit (request.py:245,
    364-377): 0 reads nothing (the spec's flag), None is unlimited; a connector's answer
    is dropped for any limit (skip_reading_external_kv, :358-362)."""
    fields = [f for f in vllm_lift.SHARED_REQUEST_FIELDS if f != "skip_reading_prefix_cache"]
    r = SimpleNamespace(**{f: 0 for f in fields})
    r.drop_stale_output = r.is_prefill_chunk = False
    for limit, skips, external in ((None, False, False), (0, True, True), (5, False, True)):
        r.prefix_cache_hit_limit = limit
        assert vllm_lift._shared_of(r)[-1] is skips
        assert vllm_lift.skips_prefix_cache(r) is skips and vllm_lift.skips_external_kv(r) is external
    old = SimpleNamespace(**{f: 0 for f in fields}, skip_reading_prefix_cache=True)
    assert vllm_lift.skips_prefix_cache(old) and vllm_lift.skips_external_kv(old)
