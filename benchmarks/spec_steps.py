"""Steps per second of the executable spec with N running requests.

Each step is a full schedule() + update_from_output() on a state with N running
decode requests (plus one waiting prompt), so the cost per step should grow
linearly with N.  Prints one line per N; run: python benchmarks/spec_steps.py
"""

from __future__ import annotations

import sys
import time

from schedspec.spec import scheduler as S
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState


def decode_state(n: int) -> SchedulerState:
    # A long max_model_len and a large pool keep every decode alive and growing for
    # the whole measurement, so each step does the same work.
    c = SchedulerConfig(max_num_batched_tokens=max(2 * n, 2048), max_num_seqs=n + 1, max_model_len=1 << 20,
                        num_gpu_blocks=(1 << 16) + 2 + 200 * n)
    reqs = {f"d{i}": Request(f"d{i}", 16, max_tokens=10**6, arrival_time=float(i), status=RequestStatus.RUNNING,
                             num_computed_tokens=16, num_output_tokens=1) for i in range(n)}
    blocks = {rid: 1 for rid in reqs}
    state = SchedulerState(config=c, requests=reqs, running=tuple(reqs), waiting=(), kv_cache=BlockCounts(c.num_usable_blocks - n, blocks))
    return S.add_request(state, make_request(c, "prompt", 4000, 10))


def bench(n: int, min_seconds: float = 1.0) -> tuple[float, int]:
    state = decode_state(n)
    steps, start = 0, time.perf_counter()
    while True:
        out, mid = S.schedule(state)
        sampled = {rid: [100] for rid, _ in out.num_scheduled_tokens
                   if mid.requests[rid].num_computed_tokens >= mid.requests[rid].num_tokens}
        _, state = S.update_from_output(mid, out, sampled)
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and steps >= 3:
            assert len(state.running) >= n, "a decode finished during the measurement"
            return steps / elapsed, steps


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [10, 100, 1000, 10000]
    print(f"{'running':>8} {'steps/s':>10} {'ms/step':>9} {'us/request/step':>16}")
    for n in sizes:
        rate, _ = bench(n)
        print(f"{n:>8} {rate:>10.1f} {1000 / rate:>9.3f} {1e6 / rate / n:>16.2f}")


if __name__ == "__main__":
    main()
