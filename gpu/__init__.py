"""The torch implementation of the scheduler: S scenarios x R request slots as
tensors on one device (CUDA when present, else the CPU), written from the rule
book, differential-tested against the spec.

- `state.py`: the tensors (`Batch`: configs and static request fields; `State`).
- `step.py`: one engine step of all scenarios (aborts, arrivals, schedule, the
  fake model, update), synchronous or with a batch in flight (async scheduling).
- `batch.py`: `run_batch(scenarios)` -> one schedspec.trace/1 per scenario;
  `run_batch_traces(scenarios)` -> the same as trace text (`TorchTrace`);
  `stream_batch_traces(scenarios, on_trace)`: each of them handed over as
  its scenario ends; `write_batch_traces(scenarios, paths)`: the trace files
  written as the run goes; `run_one(scenario)`.
- `trace_text.py`: per-step records to trace text, column by column
  (`render_chunk`), and `TorchTrace` (write, compare or parse it);
  `trace_native.py`: the C renderer `trace_render.c` (an extension module
  built at install time), which `render_chunk` uses when it was built.
- `impl.py`: `TorchScheduler`, the same step code at S = 1 behind the
  implementation protocol (`--impl torch`).
- `pool.py`: the block-level KV pool of prefix caching (hits, hashing within
  the step, the free queue's eviction order); `hashes.py`: block hash ids,
  interned on the host.
- `masks.py`: comparisons, mask ands and row counts, through numpy on the CPU
  (torch writes bool results there one element at a time).
- `limits.py`: dtype limits, the table of features torch does not model
  (`UNMODELLED`), and the checks that reject a scenario beyond either.
- `device.py`: `resolve_device`.

torch is imported by these modules; import them inside functions in CLI code.
"""
