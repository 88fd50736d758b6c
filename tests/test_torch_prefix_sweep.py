"""`schedspec sweep --set enable_prefix_caching=true,false --shared-prefix N`:
prefix caching as a sweep axis, on a workload given a shared system prompt;
torch's rows equal the spec's."""

from schedspec.gpu.sweep import parse_set, run_sweep, with_shared_prefix
from schedspec.reference.generator import generate_scenario, scenario_rng


def test_prefix_caching_axis_on_a_shared_prefix_workload():
    workloads = with_shared_prefix([generate_scenario(scenario_rng(7, i), i) for i in range(8)], 32)
    assert all(r.prefix_group == "shared" and r.prefix_len == min(32, r.prompt_len)
               for w in workloads for r in w.requests)
    axes = parse_set(["enable_prefix_caching=true,false"])
    torch_rows = run_sweep(workloads, axes, device="cpu")["rows"]
    assert run_sweep(workloads, axes, impl="spec", workers=1)["rows"] == torch_rows
    on, off = torch_rows
    assert on["config"] == {"enable_prefix_caching": True} and off["config"] == {"enable_prefix_caching": False}
    assert on["steps"] != off["steps"]  # the shared prompt is hit: the runs differ


def test_shared_prefix_zero_is_no_group():
    w = generate_scenario(scenario_rng(7, 0), 0)
    assert with_shared_prefix([w], 0)[0].requests == tuple(
        r.__class__(**{**r.__dict__, "prefix_group": None, "prefix_len": 0}) for r in w.requests)


def test_default_engine_axes():
    """Both flags of vLLM's default engine as sweep axes (four grid points in one
    torch batch, async scenarios among them): torch's rows equal the spec's, and
    async scheduling changes the runs (output one step late)."""
    workloads = with_shared_prefix([generate_scenario(scenario_rng(7, i), i) for i in range(8)], 32)
    axes = parse_set(["enable_prefix_caching=true,false", "async_scheduling=true,false"])
    torch_rows = run_sweep(workloads, axes, device="cpu")["rows"]
    assert run_sweep(workloads, axes, impl="spec", workers=1)["rows"] == torch_rows
    by = {(r["config"]["enable_prefix_caching"], r["config"]["async_scheduling"]): r for r in torch_rows}
    assert set(by) == {(p, a) for p in (True, False) for a in (True, False)}
    assert all(r.get("status") != "rejected" for r in torch_rows)
    assert by[(False, True)]["steps"] != by[(False, False)]["steps"]
