"""Server-side timings and the engine-step decomposition from vLLM's /metrics: the window maths on Prometheus text
written by prometheus_client itself, the capture hook around vLLM's bench, and the identities on one real capture
(tests/fixtures/server_metrics/, recorded from a real cpu-tiny-dsa level)."""

from __future__ import annotations

import asyncio
import json
import math
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from harness.run import loadgen, server_metrics
from harness.run.load import parse_bench_result
from harness.rundir.schema import Level

REAL = Path(__file__).parent / "fixtures" / "server_metrics" / "cpu-tiny-dsa-c4.json"


class FakeVllmMetrics:
    """A registry with vLLM's metric names and per-engine labels, exposed as real Prometheus text."""

    def __init__(self, with_tpot: bool = True):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def histogram(name):
            return Histogram(name, name, labels, registry=self.registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds")
        self.tpot = histogram("vllm:request_time_per_output_token_seconds") if with_tpot else None
        self.itl = histogram("vllm:inter_token_latency_seconds")
        self.e2el = histogram("vllm:e2e_request_latency_seconds")
        self.steps = Histogram("vllm:iteration_tokens_total", "steps", labels, registry=self.registry,
                               buckets=(1, 8, 64, 512))
        self.tokens = Counter("vllm:generation_tokens", "tokens", labels, registry=self.registry)
        for metric in (self.ttft, self.tpot, self.itl, self.e2el, self.steps, self.tokens):
            for engine in ("0", "1"):   # like vLLM's create_metric_per_engine: every engine's series exists at 0
                if metric is not None:
                    metric.labels("m", engine)

    def request(self, engine: str, ttft: float, tpot: float, e2el: float, tokens: int) -> None:
        for histogram, value in ((self.ttft, ttft), (self.tpot, tpot), (self.e2el, e2el)):
            if histogram is not None:
                histogram.labels("m", engine).observe(value)
        self.tokens.labels("m", engine).inc(tokens)

    def step(self, engine: str, tokens: int, itl: float | None = None) -> None:
        self.steps.labels("m", engine).observe(tokens)
        if itl is not None:
            self.itl.labels("m", engine).observe(itl)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_window_means_are_delta_sum_over_delta_count_summed_over_engines():
    server = FakeVllmMetrics()
    server.request("0", ttft=9.0, tpot=9.0, e2el=9.0, tokens=100)   # before the window: must not count
    server.step("0", 50, itl=9.0)
    before = server.text()
    server.request("0", ttft=0.010, tpot=0.002, e2el=0.100, tokens=30)
    server.request("1", ttft=0.030, tpot=0.004, e2el=0.300, tokens=50)
    for engine, itl in (("0", 0.001), ("1", 0.003), ("1", 0.005)):
        server.step(engine, 20, itl=itl)
    server.step("0", 20)
    fields = server_metrics.window(before, server.text(), duration_s=2.0)
    assert fields["server_mean_ttft_ms"] == pytest.approx(20.0)
    assert fields["server_mean_tpot_ms"] == pytest.approx(3.0)
    assert fields["server_mean_itl_ms"] == pytest.approx(3.0)
    assert fields["server_mean_e2el_ms"] == pytest.approx(200.0)
    assert (fields["server_requests"], fields["server_generation_tokens"], fields["engine_steps"]) == (2, 80, 4)
    assert fields["engine_steps_per_s"] == pytest.approx(2.0)
    assert fields["tokens_per_step"] == pytest.approx(20.0)
    assert fields["engine_steps_per_s"] * fields["tokens_per_step"] == pytest.approx(80 / 2.0)


def test_absent_histograms_and_empty_windows_give_none():
    server = FakeVllmMetrics(with_tpot=False)
    before = server.text()
    idle = server_metrics.window(before, server.text(), duration_s=1.0)
    assert all(idle[c] is None for c in server_metrics.TIMING_HISTOGRAMS)   # Δcount = 0
    assert idle["engine_steps"] == 0 and idle["tokens_per_step"] is None and idle["engine_steps_per_s"] == 0.0
    server.request("0", 0.01, 0.0, 0.1, 5)
    server.step("0", 5)
    fields = server_metrics.window(before, server.text(), duration_s=None)
    assert fields["server_mean_tpot_ms"] is None                            # histogram absent
    assert fields["server_mean_ttft_ms"] == pytest.approx(10.0)
    assert fields["engine_steps_per_s"] is None and fields["tokens_per_step"] == 5.0
    # a server without any vLLM metric (e.g. the fault tests' fake server): every column empty, nothing raised
    bare = "# TYPE vllm:request_success_total counter\nvllm:request_success_total 3.0\n"
    assert set(server_metrics.window(bare, bare, 1.0).values()) == {None}


def test_a_counter_that_went_down_is_a_restart():
    server = FakeVllmMetrics()
    server.request("0", 0.01, 0.001, 0.1, 5)
    with pytest.raises(ValueError, match="restarted"):
        server_metrics.window(server.text(), FakeVllmMetrics().text(), 1.0)


def test_results_without_captures_read_as_empty_and_broken_captures_are_refused():
    assert set(server_metrics.from_bench_result({"duration": 1.0}).values()) == {None}
    with pytest.raises(ValueError, match="before/after"):
        server_metrics.from_bench_result({server_metrics.RESULT_KEY: {"before": {}}})


def test_capture_wraps_the_two_reads_around_the_measured_requests():
    """A stand-in for ``vllm.benchmarks.serve`` with the real call pattern: warmups, read, requests, read."""
    server = FakeVllmMetrics()
    calls = []

    class Response:
        status = 200

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def text(self):
            return server.text()

    class Session:
        def get(self, url):
            calls.append(url)
            return Response()

    async def fetch_spec_decode_metrics(base_url, session):
        calls.append("bench's own read")
        return None

    async def benchmark(base_url):
        session = Session()
        server.request("0", 9.0, 9.0, 9.0, 100)                   # warmup
        await module.fetch_spec_decode_metrics(base_url, session)
        server.request("0", 0.02, 0.001, 0.2, 32)                 # the measured request
        server.step("0", 32)
        await module.fetch_spec_decode_metrics(base_url, session)
        return {"duration": 0.5}

    module = types.SimpleNamespace(fetch_spec_decode_metrics=fetch_spec_decode_metrics, benchmark=benchmark)
    loadgen.install_capture(module)
    result = asyncio.run(module.benchmark("http://h:1"))
    assert calls == ["http://h:1/metrics", "bench's own read"] * 2
    fields = server_metrics.from_bench_result(json.loads(json.dumps(result)))
    assert fields["server_requests"] == 1 and fields["server_mean_ttft_ms"] == pytest.approx(20.0)
    assert fields["server_generation_tokens"] == 32 and fields["engine_steps_per_s"] == pytest.approx(2.0)


def test_level_fields_round_and_keep_empty_cells():
    cells = server_metrics.level_fields({"server_mean_tpot_ms": 1.23456789, "engine_steps": 7,
                                         "tokens_per_step": float("nan")})
    assert cells["server_mean_tpot_ms"] == 1.23457 and cells["engine_steps"] == 7
    assert cells["tokens_per_step"] is None and cells["server_mean_ttft_ms"] is None
    assert tuple(cells) == server_metrics.LEVEL_COLUMNS


# ----------------------------------------------------------------------------------------------- a real capture
@pytest.fixture(scope="module")
def real():
    return json.loads(REAL.read_text())


def test_real_capture_counts_exactly_the_measured_requests(real):
    fields = server_metrics.from_bench_result(real)
    # warmups and the ready check happened before the first read: the window holds the measured requests only
    assert fields["server_requests"] == real["completed"] == real["num_prompts"]
    assert fields["server_generation_tokens"] == real["total_output_tokens"] == sum(real["output_lens"])


def test_real_capture_decomposition_reproduces_the_output_throughput(real):
    level, _ = parse_bench_result(real, "baseline", Level("random", 64, 32, 4), 0)
    cells = server_metrics.level_fields(server_metrics.from_bench_result(real))
    product = cells["engine_steps_per_s"] * cells["tokens_per_step"]
    assert product == pytest.approx(level["output_throughput"], rel=1e-4)   # the cells carry 6 significant digits
    # 4 requests in flight, and MTP (k = 1) adds the accepted drafts: more than one token per step on average
    assert 1.0 < cells["tokens_per_step"] <= 4 * 2


def test_real_capture_mtp_tokens_are_first_tokens_plus_drafts_plus_accepted(real):
    """Every decode step of a request with MTP emits its accepted drafts + 1 token; the prefill emits the first.
    Drafts cut short by max_tokens at a request's end can make the sum exceed the tokens by at most one per
    request."""
    fields = server_metrics.from_bench_result(real)
    drafts, accepted = real["spec_decode_num_drafts"], real["spec_decode_accepted_tokens"]
    expected = fields["server_requests"] + drafts + accepted
    assert 0 <= expected - fields["server_generation_tokens"] <= fields["server_requests"]


def test_real_capture_server_and_client_tpot_measure_the_same_thing(real):
    """The server's TPOT (engine timestamps) and the client's (E2EL − TTFT)/(output_len − 1) agree within the HTTP
    and streaming overhead; the server's TTFT starts at the API server, so it cannot exceed the client's."""
    fields = server_metrics.from_bench_result(real)
    assert math.isfinite(real["mean_tpot_ms"]) and fields["server_mean_tpot_ms"] > 0
    assert abs(fields["server_mean_tpot_ms"] / real["mean_tpot_ms"] - 1) < 0.25
    assert fields["server_mean_ttft_ms"] <= real["mean_ttft_ms"]
    assert fields["server_mean_e2el_ms"] <= real["mean_e2el_ms"]


# ----------------------------------------------------------------------------------------------- registry, verdict, report
def _aa_run():
    import importlib.util

    spec = importlib.util.spec_from_file_location("aa_split", Path(__file__).parent / "fixtures" / "recorded"
                                                  / "aa_split.py")
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    return aa, aa.aa_run(8)


def _with_server_columns(levels, candidate_tpot_factor: float = 1.0):
    """The recorded A/A levels with server columns derived from the client's (the server's TPOT a shade lower)."""
    levels = levels.copy()
    factor = [candidate_tpot_factor if arm == "candidate" else 1.0 for arm in levels["arm"]]
    levels["server_mean_tpot_ms"] = levels["mean_tpot_ms"].astype(float) * 0.99 * factor
    levels["tokens_per_step"] = 0.9 * levels["concurrency"].astype(float)
    levels["engine_steps_per_s"] = levels["output_throughput"].astype(float) / levels["tokens_per_step"]
    return levels


def test_server_metrics_are_registered_gateable_level_metrics_not_primary_by_default():
    from harness.judge.policy import DEFAULT_PRIMARY, METRICS as GATEABLE
    from harness.metrics import METRICS, REPORT_TABLE, SERVER_SIDE
    from harness.rundir import schema

    assert set(SERVER_SIDE) <= set(REPORT_TABLE) and set(SERVER_SIDE) <= set(schema.LEVEL_COLUMNS)
    assert not set(SERVER_SIDE) & set(DEFAULT_PRIMARY)
    assert all(METRICS[name].source == "level" for name in SERVER_SIDE)
    assert {"server_mean_tpot_ms", "engine_steps_per_s", "tokens_per_step"} <= set(GATEABLE)
    assert "(E2EL − TTFT) / (output_len − 1)" in METRICS["server_mean_tpot_ms"].formula
    for client in ("ttft", "tpot", "itl", "e2el"):   # each server row sits right under its client row
        assert REPORT_TABLE.index(f"server_mean_{client}_ms") == REPORT_TABLE.index(f"mean_{client}_ms") + 1


def test_diagnostic_server_cells_appear_only_with_data():
    from harness.judge import verdict
    from harness.judge.policy import GatePolicy
    from harness.metrics import SERVER_SIDE

    aa, run = _aa_run()
    manifest, levels, requests = aa.typed(run)
    policy = GatePolicy(primary=("output_throughput",))
    old = verdict.evaluate(manifest, levels, requests, None, policy, diagnostics=True)
    assert not [c for c in old.cells if c.metric in SERVER_SIDE]
    new = verdict.evaluate(manifest, _with_server_columns(levels), requests, None, policy, diagnostics=True)
    shown = {c.metric for c in new.cells if not c.primary and c.status is None and c.ci_low is not None}
    assert {"server_mean_tpot_ms", "engine_steps_per_s", "tokens_per_step"} <= shown


def test_server_tpot_can_be_the_primary_metric():
    from harness.judge import verdict
    from harness.judge.policy import GatePolicy, Status

    aa, run = _aa_run()
    manifest, levels, requests = aa.typed(run)
    policy = GatePolicy(primary=("server_mean_tpot_ms",))
    missing = verdict.evaluate(manifest, levels, requests, None, policy, diagnostics=False)
    assert missing.status == Status.INVALID and "/metrics" in missing.primary[0].note()
    same = verdict.evaluate(manifest, _with_server_columns(levels), requests, None, policy, diagnostics=False)
    assert same.status != Status.INVALID and same.status != Status.FAIL
    slower = verdict.evaluate(manifest, _with_server_columns(levels, 1.15), requests, None, policy,
                              diagnostics=False)
    assert slower.status == Status.FAIL


def test_report_shows_server_rows_under_the_client_rows(tmp_path):
    import csv
    import shutil

    from harness.render import render_report
    from harness.rundir import store as records

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "run_dir", run_dir)
    with (run_dir / "levels.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["server_mean_tpot_ms"] = f"{float(row['mean_tpot_ms']) * 0.5:.4f}"
        row["engine_steps_per_s"], row["tokens_per_step"] = "123.5", "4.25"
    (run_dir / "levels.csv").write_text(records.rows_to_csv(rows, tuple(rows[0])))
    html = render_report(run_dir).read_text(encoding="utf-8")
    table = html[html.index('data-concurrency="1"', html.index('id="levels"')):]
    table = table[:table.index("</table>")]
    order = [name for name in ("output_throughput", "engine_steps_per_s", "tokens_per_step", "mean_tpot_ms",
                               "server_mean_tpot_ms", "median_tpot_ms") if f'data-metric="{name}"' in table]
    assert order == ["output_throughput", "engine_steps_per_s", "tokens_per_step", "mean_tpot_ms",
                     "server_mean_tpot_ms", "median_tpot_ms"]
    assert [table.index(f'data-metric="{n}"') for n in order] == sorted(table.index(f'data-metric="{n}"')
                                                                        for n in order)
    assert "123.50" in table and "Mean TPOT, server" in table
    assert 'data-metric="server_mean_ttft_ms"' not in table   # no data for it in this run: no row


def test_installed_vllm_bench_reads_metrics_twice_in_benchmark_and_calls_it_by_module_name():
    """The capture relies on vLLM's bench calling the module-level ``fetch_spec_decode_metrics`` exactly twice in
    ``benchmark()`` and ``main_async`` calling the module-level ``benchmark``; read from the installed source (AST,
    without importing vLLM), so a vLLM upgrade that changes either fails here."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec("vllm").origin).parent / "benchmarks" / "serve.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.AsyncFunctionDef)}

    def calls(function: str, name: str) -> int:
        return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
                   for node in ast.walk(functions[function]))

    assert calls("benchmark", "fetch_spec_decode_metrics") == 2
    assert calls("main_async", "benchmark") == 1


def test_unreadable_captures_leave_the_server_columns_empty_and_say_why():
    from harness.run import server_metrics

    columns, why = server_metrics.level_columns({server_metrics.RESULT_KEY: {"before": {}}, "duration": 1.0})
    assert set(columns) == set(server_metrics.LEVEL_COLUMNS) and all(v is None for v in columns.values())
    assert "before/after" in why
    assert server_metrics.level_columns({"duration": 1.0})[1] is None          # no captures: empty, nothing wrong


def test_goodput_cells_are_judged_where_an_slo_was_measured_and_say_so_where_not():
    """Issue #26 item 4: goodput (requests meeting every SLO / s) is a paired-ratio cell like throughput, and SLO
    attainment a diagnostic beside it; a run recorded without ``[slo]`` has neither, and a policy that gates goodput
    on it is INVALID naming the fix."""
    from harness.judge import verdict
    from harness.judge.policy import GatePolicy, Status

    aa, run = _aa_run()
    manifest, levels, requests = aa.typed(run)
    policy = GatePolicy(primary=("request_goodput",))
    missing = verdict.evaluate(manifest, levels, requests, None, policy, diagnostics=False)
    assert missing.status == Status.INVALID and "[slo]" in missing.primary[0].note()
    measured = levels.assign(request_goodput=levels["request_throughput"] * 0.9, slo_attainment=0.9)
    judged = verdict.evaluate(manifest, measured, requests, None, policy, diagnostics=True)
    assert judged.status not in (Status.INVALID, Status.FAIL)
    assert {c.metric for c in judged.cells if not c.primary and c.ci_low is not None} >= {"slo_attainment"}
    lost = measured.assign(request_goodput=measured["request_goodput"].where(measured["arm"] == "baseline",
                                                                             measured["request_goodput"] * 0.7))
    assert verdict.evaluate(manifest, lost, requests, None, policy, diagnostics=False).status == Status.FAIL


def test_slo_attainment_has_an_exact_binomial_lower_bound_per_arm_and_level(tmp_path):
    """``verdict.json`` ``slo``: per level and arm the requests meeting every SLO and the Clopper–Pearson one-sided
    lower bound (the exact binomial tail LoadGen's early stopping uses); summary.md states it; none without [slo]."""
    from scipy.stats import binom

    from harness import gate
    from harness.judge.attainment import attainment_bound

    assert attainment_bound(0, 10, 0.05) == 0.0 and attainment_bound(10, 10, 0.05) == pytest.approx(0.05 ** 0.1)
    lower = attainment_bound(95, 100, 0.05)
    assert binom.sf(94, 100, lower) == pytest.approx(0.05, rel=1e-6)     # P(X ≥ 95 | p = lower) = α: exact
    with pytest.raises(ValueError):
        attainment_bound(5, 4, 0.05)
    aa, (manifest, levels, requests) = _aa_run()
    plain = gate.run_gate(aa.write_run(tmp_path / "plain", manifest, levels, requests), write=False)
    assert plain.document["slo"] == []
    measured = levels.assign(slo_attainment=0.75)
    result = gate.run_gate(aa.write_run(tmp_path / "slo", manifest, measured, requests))
    rows = result.document["slo"]
    assert {row["arm"] for row in rows} == {"baseline", "candidate"} and len(rows) == 2 * levels["level"].nunique()
    first = rows[0]
    assert first["good"] == round(0.75 * first["requests"]) and first["share"] == pytest.approx(0.75, abs=0.01)
    assert first["lower"] < first["share"]
    assert "SLO attainment (requests meeting every objective of [slo]" in (result.run_dir / "summary.md").read_text()
