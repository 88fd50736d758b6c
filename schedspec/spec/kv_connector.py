"""A KV connector's external hits (vLLM 0.33.0), as what the environment holds.

The spec has no connector.  What one could load for a request is part of the
request: `kv_connector_tokens`, the leading tokens of its sequence a remote store
holds, or None while the connector cannot tell yet.  At an admission from zero
computed tokens vLLM asks the connector for the tokens beyond the local prefix
hit (S:1130-1144).  An answer of None skips the request for this step, kept in
its place (S:1146-1151); tokens are counted computed and loaded within the step, a
synchronous load (S:1178-1218, 1550-1552).  Their blocks are new blocks (K:559-566),
cached as they fill like computed ones (K:617-625).

Not modelled (the monitor names them, monitor/scope.py): asynchronous loads
(WAITING_FOR_REMOTE_KVS), delayed and deferred frees, failed loads.
"""

from __future__ import annotations

from .request import Request


# vLLM asks only at an admission from zero computed tokens (S:1110); in the spec's scope
# every waiting request has none (a preemption resets them, S:1822), so the rules below
# are applied to the requests the waiting loop reaches, without that test.


def undecided(r: Request) -> bool:
    """The connector cannot tell yet: the waiting loop skips `r` (S:1146-1151); not a
    request that skips the prefix cache, whose answer is replaced by none (S:1143-1144)."""
    return r.kv_connector_tokens is None and not r.skip_reading_prefix_cache


def external_tokens(r: Request, num_local_computed_tokens: int) -> int:
    """The tokens the connector loads for `r` beyond its local prefix hit
    (S:1138-1187); the spec's local hits are whole blocks, so vLLM's sub-block
    tail rule (S:1167-1185) never acts."""
    if r.skip_reading_prefix_cache or not r.kv_connector_tokens:
        return 0
    return max(0, r.kv_connector_tokens - num_local_computed_tokens)
